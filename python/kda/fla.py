"""kda as flash-linear-attention's (fla ≥ 0.6) CPU backend for KDA and Gated DeltaNet: ``import kda.fla``
registers it.

After the import, fla's own entries run kda on CPU tensors: ``fla.ops.kda.chunk_kda``,
``fla.ops.kda.fused_recurrent_kda`` (through fla's dispatched ``fused_recurrent_kda_fwd``),
``fla.ops.kda.gate.fused_kda_gate``, ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` and
``fla.ops.gated_delta_rule.gate.fused_gdn_gate`` (through fla's dispatched ``gdn_gate_fwd``; its
``gdn_gate_chunk_cumsum`` too), so HF transformers' Kimi-Linear and fla's layers run on the CPU with
one import. fla's ``fused_recurrent_gated_delta_rule`` is not dispatched (it launches its Triton
kernel directly), so it stays fla's: call ``kda.torch.fused_recurrent_gated_delta_rule`` instead.

The backend (``backend_type = "kda_cpu"``, disabled with ``FLA_KDA_CPU=0``) takes a call when its
tensors are CPU tensors and the call asks for nothing kda refuses (``cp_context``); the chunk entries
and the gates, which fla differentiates, also need tensors that do not require grad under grad mode
(kda is forward-only), while the recurrent entry, which has no backward in fla either, takes them and
returns results without a graph. Every other check is kda's own, whose errors name the argument.
Other calls (CUDA tensors, training) go on to fla's other backends and its Triton kernels.
"""

from __future__ import annotations

import torch
from fla.backends import BaseBackend, register
from fla.ops.kda.chunk import chunk_kda as _fla_chunk_kda

from . import torch as _kt

__all__ = ["KdaCpuBackend", "KdaCpuOpsBackend", "KdaCpuGatedDeltaRuleBackend"]


def _tensors(args, kwargs):
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            yield x


def _cpu(args, kwargs, inference: bool = True) -> tuple[bool, str | None]:
    """Whether kda can take the call: CPU tensors, no context parallelism, and with ``inference``
    nothing needing a gradient."""
    tensors = list(_tensors(args, kwargs))
    if not tensors:
        return False, "kda_cpu: no tensor arguments"
    for t in tensors:
        if t.device.type != "cpu":
            return False, f"kda_cpu: takes CPU tensors, got one on {t.device}"
    if inference and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False, "kda_cpu: forward-only (a tensor requires grad)"
    if kwargs.get("cp_context") is not None:
        return False, "kda_cpu: no context parallelism (cp_context)"
    return True, None


def _verifier(inference: bool):
    """An entry's verifier: CPU tensors, no context parallelism, and with ``inference`` (the chunk entries
    and the gates, which fla differentiates) nothing needing a gradient; the recurrent entry has no
    backward in fla either and takes tensors that require grad."""

    def verify(*args, **kwargs) -> tuple[bool, str | None]:
        return _cpu(args, kwargs, inference)

    return staticmethod(verify)


def _kda_torch(name: str):
    """kda.torch's function ``name``, looked up at each call."""

    def call(*args, **kwargs):
        return getattr(_kt, name)(*args, **kwargs)

    return staticmethod(call)


def gdn_gate_chunk_cumsum(g, A_log, chunk_size, scale=None, dt_bias=None, cu_seqlens=None, chunk_indices=None,
                          output_dtype=torch.float):
    """fla's ``gdn_gate_chunk_cumsum`` (forward): the GDN gate ``-exp(A_log) * softplus(g + dt_bias)`` of
    g [B, T, HV], summed cumulatively within each chunk of ``chunk_size`` tokens (of each sequence with
    ``cu_seqlens``, B = 1), times ``scale`` when given; float32 math, returned as ``output_dtype`` (None:
    g's dtype). ``chunk_indices`` (fla's chunks of cu_seqlens) is a hint: the chunks follow cu_seqlens."""
    y = _kt.fused_gdn_gate(g, A_log, dt_bias)
    B, T, HV = y.shape
    rows = [(b, 0, T) for b in range(B)]
    if cu_seqlens is not None:
        cu = [int(x) for x in cu_seqlens.tolist()]
        rows = [(0, a, e) for a, e in zip(cu[:-1], cu[1:])]
    o = torch.empty_like(y)
    for b, bos, eos in rows:
        n = eos - bos
        pad = -n % chunk_size
        x = torch.nn.functional.pad(y[b, bos:eos], (0, 0, 0, pad)).view(-1, chunk_size, HV)
        o[b, bos:eos] = x.cumsum(dim=1).view(-1, HV)[:n]
    if scale is not None:
        o *= scale
    return o.to(output_dtype or g.dtype)


def _fused_kda_gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=torch.float32):
    return _kt.fused_kda_gate(g, A_log, dt_bias, lower_bound=lower_bound, output_dtype=output_dtype)


def _gdn_gate_fwd(g, A_log, dt_bias=None, output_dtype=torch.float32):
    return _kt.fused_gdn_gate(g, A_log, dt_bias, output_dtype=output_dtype)


class _KdaCpu(BaseBackend):
    backend_type = "kda_cpu"
    package_name = "kda"
    env_var = "FLA_KDA_CPU"
    default_enable = True
    priority = 1  # before fla's GPU backends: they never take CPU tensors anyway
    #: The entries a backend serves, as data: fla's name -> (kda's function, forward-only); the function is
    #: a callable or the name of kda.torch's, looked up at each call. Each becomes the entry ``name`` and
    #: its ``name_verifier``.
    entries: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, (fn, inference) in cls.entries.items():
            setattr(cls, name, staticmethod(fn) if callable(fn) else _kda_torch(fn))
            setattr(cls, f"{name}_verifier", _verifier(inference))


@register(_fla_chunk_kda)
class KdaCpuBackend(_KdaCpu):
    """fla's ``chunk_kda`` (a function-dispatched entry) on kda's kernels."""

    entries = {"chunk_kda": ("chunk_kda", True)}


@register("kda")
class KdaCpuOpsBackend(_KdaCpu):
    """fla's ``kda`` operation entries: ``fused_recurrent_kda_fwd`` and ``fused_kda_gate``."""

    entries = {
        "fused_recurrent_kda_fwd": ("fused_recurrent_kda_fwd", False),
        "fused_kda_gate": (_fused_kda_gate, True),
    }


@register("gated_delta_rule")
class KdaCpuGatedDeltaRuleBackend(_KdaCpu):
    """fla's ``gated_delta_rule`` operation entries: ``chunk_gated_delta_rule``, ``gdn_gate_fwd`` (the
    forward of ``fused_gdn_gate``, whose backward ``gdn_gate_bwd`` stays fla's) and
    ``gdn_gate_chunk_cumsum``."""

    entries = {
        "chunk_gated_delta_rule": ("chunk_gated_delta_rule", True),
        "gdn_gate_fwd": (_gdn_gate_fwd, True),
        "gdn_gate_chunk_cumsum": (gdn_gate_chunk_cumsum, True),
    }
