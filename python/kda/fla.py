"""kda as flash-linear-attention's (fla ≥ 0.6) CPU backend for KDA: ``import kda.fla`` registers it.

After the import, fla's own entries run kda on CPU tensors: ``fla.ops.kda.chunk_kda``,
``fla.ops.kda.fused_recurrent_kda`` (through fla's dispatched ``fused_recurrent_kda_fwd``) and
``fla.ops.kda.gate.fused_kda_gate`` (so HF transformers' Kimi-Linear and fla's layers run on the CPU
with one import). The backend (``backend_type = "kda_cpu"``, disabled with ``FLA_KDA_CPU=0``) takes a
call when its tensors are CPU tensors that do not require grad under grad mode (kda is
forward-only) and the call asks for nothing kda refuses (``cp_context``); every other check is
kda's own, whose errors name the argument.
Other calls (CUDA tensors, training) go on to fla's other backends and its Triton kernels.
"""

from __future__ import annotations

import torch
from fla.backends import BaseBackend, register
from fla.ops.kda.chunk import chunk_kda as _fla_chunk_kda

from . import torch as _kt

__all__ = ["KdaCpuBackend", "KdaCpuOpsBackend"]


def _tensors(args, kwargs):
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            yield x


def _cpu_inference(args, kwargs) -> tuple[bool, str | None]:
    """Whether kda can take the call: CPU tensors, nothing needing a gradient."""
    tensors = list(_tensors(args, kwargs))
    if not tensors:
        return False, "kda_cpu: no tensor arguments"
    for t in tensors:
        if t.device.type != "cpu":
            return False, f"kda_cpu: takes CPU tensors, got one on {t.device}"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False, "kda_cpu: forward-only (a tensor requires grad)"
    if kwargs.get("cp_context") is not None:
        return False, "kda_cpu: no context parallelism (cp_context)"
    return True, None


class _KdaCpu(BaseBackend):
    backend_type = "kda_cpu"
    package_name = "kda"
    env_var = "FLA_KDA_CPU"
    default_enable = True
    priority = 1  # before fla's GPU backends: they never take CPU tensors anyway


@register(_fla_chunk_kda)
class KdaCpuBackend(_KdaCpu):
    """fla's ``chunk_kda`` (a function-dispatched entry) on kda's kernels."""

    def chunk_kda_verifier(self, *args, **kwargs):
        return _cpu_inference(args, kwargs)

    def chunk_kda(self, *args, **kwargs):
        return _kt.chunk_kda(*args, **kwargs)


@register("kda")
class KdaCpuOpsBackend(_KdaCpu):
    """fla's ``kda`` operation entries: ``fused_recurrent_kda_fwd`` and ``fused_kda_gate``."""

    def fused_recurrent_kda_fwd_verifier(self, *args, **kwargs):
        return _cpu_inference(args, kwargs)

    def fused_recurrent_kda_fwd(self, *args, **kwargs):
        return _kt.fused_recurrent_kda_fwd(*args, **kwargs)

    def fused_kda_gate_verifier(self, *args, **kwargs):
        return _cpu_inference(args, kwargs)

    def fused_kda_gate(self, g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=torch.float32):
        return _kt.fused_kda_gate(g, A_log, dt_bias, lower_bound=lower_bound, output_dtype=output_dtype)
