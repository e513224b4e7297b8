"""kda's CPU kernels inside Hugging Face transformers (5.25) models with KDA, Gated DeltaNet or Mamba2 layers.

:func:`enable` registers kda with the ``kernels`` package (0.19) for device ``"cpu"`` in inference
mode (``{"cpu": {Mode.INFERENCE: repository}}``), under the names transformers hooks in its models:

- ``chunk_kda`` and ``fused_recurrent_kda`` (Kimi-Linear, GLM-5 Next, Bailing hybrid): kda's
  ``chunk_kda`` and ``fused_recurrent_kda`` (kda.torch);
- ``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` (Qwen3-Next, Qwen3.5,
  Qwen3.5-MoE, Qwen4-Exp, OLMo hybrid, Lara-Mini): kda's Gated DeltaNet entries;
- ``causal_conv1d_fn``: kda's short causal conv + SiLU over the packed sequences
  (``kda._core.short_conv_silu``), with a conv bias if any (Mamba2 mixers); ``causal_conv1d_update``
  (a decode step, the conv state updated in place): the same conv, in torch, summed in float32 and
  rounded once;
- ``mamba_chunk_scan_combined`` and ``selective_state_update`` (the Mamba2 mixers of mamba2,
  nemotron_h, granitemoehybrid, bamba, falcon_h1 and zamba2: their chunked prefill scan and their
  decode step): kda's SSD scan (kda.torch's mamba_ssm entries), the prefill's packed sequences kept
  apart by ``seq_idx``, ``cu_seqlens`` or ``cu_seq_lens_q``;
- the layer ``RMSNormGated``: kda's gated RMSNorm (``kda._core.gated_rms_norm``) with the module's
  own ``weight``, ``variance_epsilon`` and ``activation`` (a sigmoid gate, or silu: gate * sigmoid(gate)
  in float32 inside the norm's one expression, rounded once).

A model loaded afterwards with ``from_pretrained`` on the CPU is kernelized by transformers; an
existing one takes ``kernels.kernelize(model, device="cpu", mode=Mode.INFERENCE)``. Packed
sequences are kept apart: the GDN layers pass their boundaries as ``cu_seqlens``, the KDA layers as
``cu_seq_lens_q`` (both read, also by the conv). Nothing in transformers is patched: the
replacements are ``kernels`` layers bound to transformers' own modules.

A call kda does not take goes on to transformers' own route (its fla or torch code, as without
kda): tensors off the CPU, tensors that require grad under grad mode (kda is forward-only: run the
model under ``torch.no_grad()`` or ``torch.inference_mode()``, as ``generate`` does), and shapes or
options kda lacks (K or V above 256, an activation other than SiLU, a norm gate other than
sigmoid or silu, float16 conv or norm inputs). Training (``Mode.TRAINING``) and
``torch.compile`` modes are not registered, so they keep transformers' route. :func:`disable`
registers no kda entry for those names on the CPU; models kernelized while it was enabled keep kda
until they are kernelized again. :func:`call_counts` says how many calls kda took and passed on.
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
from kernels import Mode, register_kernel_mapping
from torch import nn

from . import _core
from . import torch as _kt

__all__ = ["enable", "disable", "kernel_mapping", "call_counts"]

# Activations transformers names for SiLU.
_SILU = ("silu", "swish")
_ACT_DTYPES = (torch.float32, torch.bfloat16)
_DELTA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_HEAD_DIM = 256  # kda's bound on K and V
_MAX_CONV_WIDTH = 64

_COUNTS: collections.Counter = collections.Counter()


def call_counts(reset: bool = False) -> dict:
    """How many calls each hook ran on kda and passed on to transformers' own route since the last
    reset: ``{hook: {"kda": n, "transformers": m}}`` (hooks without calls omitted)."""
    out: dict = {}
    for (hook, route), n in _COUNTS.items():
        out.setdefault(hook, {"kda": 0, "transformers": 0})[route] = n
    if reset:
        _COUNTS.clear()
    return out


def _takes(*tensors) -> bool:
    """Whether kda can serve a call with these arguments: CPU tensors, none needing a gradient."""
    ts = [t for t in tensors if isinstance(t, torch.Tensor)]
    if any(t.device.type != "cpu" for t in ts):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in ts))


def _transformers(module: nn.Module, hook: str, *args, **kwargs):
    """The call on transformers' own route: the hooked module's class forward (its fla or torch code)."""
    _COUNTS[(hook, "transformers")] += 1
    return type(module).forward(module, *args, **kwargs)


def _packed(kwargs: dict):
    """The packed boundaries of a call: ``cu_seqlens`` (GDN layers) or ``cu_seq_lens_q`` (KDA layers)."""
    for name in ("cu_seqlens", "cu_seq_lens_q"):
        cu = kwargs.get(name)
        if cu is not None:
            return cu
    return None


def _delta_rule_call(q, k, v, g, beta, initial_state, cu) -> bool:
    """A delta-rule call kda takes: CPU tensors without grad, q, k, v of one float dtype, K, V <= 256,
    value heads a multiple of the key heads."""
    if not _takes(q, k, v, g, beta, initial_state, cu):
        return False
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.dtype not in _DELTA_DTYPES:
        return False
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    H, K, HV, V = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    return 0 < K <= _MAX_HEAD_DIM and 0 < V <= _MAX_HEAD_DIM and H > 0 and HV % H == 0


def _state(s):
    """A recurrent state as kda reads it: float32, C-contiguous (no copy when it is)."""
    return None if s is None else s.detach().to(torch.float32).contiguous()


class ChunkKda(nn.Module):
    """transformers' ``chunk_kda`` hook on kda.torch.chunk_kda. g arrives final (the model's
    forget gate already applied, float32 or the activation dtype), beta after its sigmoid."""

    def forward(self, query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, **kwargs):
        cu = _packed(kwargs)
        if not _delta_rule_call(query, key, value, g, beta, initial_state, cu):
            return _transformers(self, "chunk_kda", query, key, value, g, beta, chunk_size, initial_state,
                                 output_final_state, use_qk_l2norm_in_kernel, **kwargs)
        _COUNTS[("chunk_kda", "kda")] += 1
        return _kt.chunk_kda(query, key, value, g.contiguous(), beta.contiguous(), initial_state=_state(initial_state),
                             output_final_state=bool(output_final_state),
                             use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), cu_seqlens=cu)


class FusedRecurrentKda(nn.Module):
    """transformers' ``fused_recurrent_kda`` hook (a decode step) on kda.torch.fused_recurrent_kda."""

    def forward(self, query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel=False,
                **kwargs):
        cu = _packed(kwargs)
        if not _delta_rule_call(query, key, value, g, beta, initial_state, cu):
            return _transformers(self, "fused_recurrent_kda", query, key, value, g, beta, initial_state,
                                 output_final_state, use_qk_l2norm_in_kernel, **kwargs)
        _COUNTS[("fused_recurrent_kda", "kda")] += 1
        return _kt.fused_recurrent_kda(query, key, value, g.contiguous(), beta.contiguous(),
                                       initial_state=_state(initial_state), output_final_state=bool(output_final_state),
                                       use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), cu_seqlens=cu)


class ChunkGatedDeltaRule(nn.Module):
    """transformers' ``chunk_gated_delta_rule`` hook on kda.torch.chunk_gated_delta_rule: g [B, T, HV]
    final (float32), beta as the model computes it (2·sigmoid for OLMo's negative eigenvalues)."""

    def forward(self, query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, **kwargs):
        cu = _packed(kwargs)
        if not _delta_rule_call(query, key, value, g, beta, initial_state, cu):
            return _transformers(self, "chunk_gated_delta_rule", query, key, value, g, beta, chunk_size,
                                 initial_state, output_final_state, use_qk_l2norm_in_kernel, **kwargs)
        _COUNTS[("chunk_gated_delta_rule", "kda")] += 1
        return _kt.chunk_gated_delta_rule(query, key, value, g.contiguous(), beta.contiguous(),
                                          initial_state=_state(initial_state),
                                          output_final_state=bool(output_final_state),
                                          use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), cu_seqlens=cu)


class FusedRecurrentGatedDeltaRule(nn.Module):
    """transformers' ``fused_recurrent_gated_delta_rule`` hook (a decode step) on
    kda.torch.fused_recurrent_gated_delta_rule."""

    def forward(self, query, key, value, g, beta, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, **kwargs):
        cu = _packed(kwargs)
        if not _delta_rule_call(query, key, value, g, beta, initial_state, cu):
            return _transformers(self, "fused_recurrent_gated_delta_rule", query, key, value, g, beta,
                                 initial_state, output_final_state, use_qk_l2norm_in_kernel, **kwargs)
        _COUNTS[("fused_recurrent_gated_delta_rule", "kda")] += 1
        return _kt.fused_recurrent_gated_delta_rule(query, key, value, g=g.contiguous(), beta=beta.contiguous(),
                                                    initial_state=_state(initial_state),
                                                    output_final_state=bool(output_final_state),
                                                    use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel),
                                                    cu_seqlens=cu)


def _conv_boundaries(kwargs: dict, B: int, T: int):
    """The conv's sequences as cu_seqlens [N + 1] int64: the packed boundaries of a B = 1 call
    (``cu_seqlens``, ``cu_seq_lens_q``, or causal_conv1d's ``seq_idx``), else the B rows. None when
    given boundaries do not describe the call's T tokens."""
    cu = _packed(kwargs)
    seq_idx = kwargs.get("seq_idx")
    if cu is None and seq_idx is not None:
        if B != 1 or seq_idx.shape[-1] != T:
            return None
        s = seq_idx.reshape(-1)
        starts = torch.nonzero(s[1:] != s[:-1]).reshape(-1) + 1
        cu = torch.cat([s.new_zeros(1), starts, s.new_full((1,), T)])
    if cu is None:
        return torch.arange(0, (B + 1) * T, T, dtype=torch.int64)
    cu = cu.detach().to(device="cpu", dtype=torch.int64).reshape(-1).contiguous()
    if B != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != T:
        return None
    return cu


class CausalConv1dFn(nn.Module):
    """transformers' ``causal_conv1d_fn`` hook on kda's short conv + SiLU: hidden_states [B, C, T]
    (read in place when its channels are contiguous: the transposed [B, T, C] projection), weight
    [C, W], optional bias [C] (Mamba2's conv1d; added in float32 before the SiLU); out [B, C, T] in
    hidden_states' dtype, rounded once, as a view of [B, T, C] memory. Packed sequences (one row) do
    not see each other's tokens."""

    def forward(self, hidden_states, weight, bias=None, activation=None, **kwargs):
        x, w = hidden_states, weight
        ok = (_takes(x, w, bias, _packed(kwargs)) and activation in _SILU and x.dim() == 3
              and w.dim() == 2 and x.dtype in _ACT_DTYPES and w.is_floating_point() and w.shape[0] == x.shape[1]
              and 1 <= w.shape[1] <= _MAX_CONV_WIDTH and x.shape[2] > 0
              and (bias is None or (isinstance(bias, torch.Tensor) and bias.is_floating_point()
                                    and tuple(bias.shape) == (w.shape[0],))))
        cu = _conv_boundaries(kwargs, x.shape[0], x.shape[2]) if ok else None
        if cu is None:
            return _transformers(self, "causal_conv1d_fn", hidden_states, weight, bias, activation, **kwargs)
        _COUNTS[("causal_conv1d_fn", "kda")] += 1
        B, C, T = x.shape
        W = w.shape[1]
        xt = x.detach().transpose(1, 2)  # [B, T, C]
        if xt.stride(2) != 1 or (T > 1 and xt.stride(1) < C) or (B > 1 and xt.stride(0) != T * xt.stride(1)):
            xt = xt.contiguous()
        rows = xt.reshape(B * T, C)  # a view: rows of C channels, stride >= C
        N = cu.numel() - 1
        y = torch.empty((B * T, C), dtype=x.dtype)
        tails = torch.empty((N, W - 1, C), dtype=x.dtype)  # written by the kernel, not read (no initial state)
        b = None if bias is None else bias.detach().to(torch.float32).contiguous()  # [C]
        _core.short_conv_silu(y, rows, w.detach().t().to(torch.float32).contiguous(), cu, tails,
                              torch.arange(N, dtype=torch.int32), torch.zeros(N, dtype=torch.uint8), bias=b)
        return y.view(B, T, C).transpose(1, 2)


class CausalConv1dUpdate(nn.Module):
    """transformers' ``causal_conv1d_update`` hook (a decode step): hidden_states [B, C, T] after the
    conv_state [B, C, S] (updated in place to the last S inputs), weight [C, W], optional bias; the
    conv summed in float32, then the activation (None or SiLU), rounded once to hidden_states' dtype."""

    def forward(self, hidden_states, conv_state, weight, bias=None, activation=None):
        x, s, w = hidden_states, conv_state, weight
        ok = (_takes(x, s, w, bias) and activation in (None, *_SILU) and x.dim() == 3 and s.dim() == 3
              and w.dim() == 2 and x.is_floating_point() and w.shape[0] == x.shape[1] and s.shape[:2] == x.shape[:2]
              and s.shape[2] >= w.shape[1] - 1 and x.shape[2] > 0)
        if not ok:
            return _transformers(self, "causal_conv1d_update", hidden_states, conv_state, weight, bias, activation)
        _COUNTS[("causal_conv1d_update", "kda")] += 1
        T, S, W = x.shape[2], s.shape[2], w.shape[1]
        full = torch.cat([s, x.detach()], dim=-1)
        s.copy_(full[..., T:])
        window = full[..., S - (W - 1):].to(torch.float32)  # the last T + W - 1 inputs
        w32 = w.detach().to(torch.float32)
        if T == 1:
            out = (window * w32).sum(-1, keepdim=True)
        else:
            out = F.conv1d(window, w32.unsqueeze(1), groups=w32.shape[0])
        if bias is not None:
            out = out + bias.detach().to(torch.float32)[:, None]
        if activation is not None:
            out = F.silu(out)
        return out.to(x.dtype)


class RMSNormGated(nn.Module):
    """transformers' ``RMSNormGated`` layer (every KDA and GDN family's output norm) on kda's gated
    RMSNorm: o * rsqrt(mean(o²) + variance_epsilon) * weight * act(gate) per head, float32
    arithmetic, rounded once (act: sigmoid, or silu = gate * sigmoid(gate), both in the kernel)."""

    def forward(self, hidden_states, gate=None):
        act = getattr(self, "activation", None)
        weight = getattr(self, "weight", None)
        x = hidden_states
        ok = (gate is not None and act in ("sigmoid", *_SILU) and isinstance(weight, torch.Tensor)
              and _takes(x, gate, weight) and x.dtype in _ACT_DTYPES and gate.dtype in _ACT_DTYPES
              and x.dim() >= 1 and x.shape[-1] > 0 and tuple(weight.shape) == (x.shape[-1],) and gate.shape == x.shape)
        if not ok:
            return _transformers(self, "RMSNormGated", hidden_states, gate)
        _COUNTS[("RMSNormGated", "kda")] += 1
        V = x.shape[-1]
        # Mixed input and gate dtypes: both in float32, the result rounded once to x's dtype.
        dt = x.dtype if gate.dtype == x.dtype else torch.float32
        o = x.detach().reshape(-1, V).to(dt).contiguous()
        z = gate.detach().reshape(-1, V).to(dt).contiguous()
        y = torch.empty_like(o)
        _core.gated_rms_norm(y, o, z, weight.detach().to(torch.float32).contiguous(), float(self.variance_epsilon),
                             activation="silu" if act in _SILU else "sigmoid")
        return y.to(x.dtype).view(x.shape)


def _ssd_call(x, state, B, C, *others) -> bool:
    """A Mamba2 scan call kda takes: CPU tensors without grad, x, B, C (and the state) of a float dtype kda
    reads, headdim and dstate <= 256."""
    if not _takes(x, state, B, C, *others):
        return False
    ts = [t for t in (x, B, C, state) if t is not None]
    if any(not isinstance(t, torch.Tensor) or t.dtype not in _DELTA_DTYPES for t in ts):
        return False
    return x.dim() >= 2 and 0 < x.shape[-1] <= _MAX_HEAD_DIM and 0 < B.shape[-1] <= _MAX_HEAD_DIM


class MambaChunkScanCombined(nn.Module):
    """transformers' ``mamba_chunk_scan_combined`` hook (Mamba2 mixers' chunked scan, every prefill) on
    kda.torch.mamba_chunk_scan_combined, with the model's packed boundaries (``seq_idx``,
    ``cu_seqlens``, or ``cu_seq_lens_q`` as the conv reads them). Returns float32, as transformers'
    own path does."""

    def forward(self, hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, **kwargs):
        z, seq_idx = kwargs.get("z"), kwargs.get("seq_idx")
        cu = None if seq_idx is not None else _packed(kwargs)
        if not (_ssd_call(hidden_states, initial_states, B, C, dt, A, D, z, dt_bias, seq_idx, cu)
                and hidden_states.dim() == 4 and (cu is None or hidden_states.shape[0] == 1)):
            return _transformers(self, "mamba_chunk_scan_combined", hidden_states, dt, A, B, C, chunk_size, D,
                                 dt_bias, initial_states, dt_softplus, dt_limit, return_final_states, **kwargs)
        _COUNTS[("mamba_chunk_scan_combined", "kda")] += 1
        return _kt.mamba_chunk_scan_combined(
            hidden_states.detach().float(), dt.detach(), A.detach(), B.detach(), C.detach(), int(chunk_size),
            D=None if D is None else D.detach(), z=None if z is None else z.detach(),
            dt_bias=None if dt_bias is None else dt_bias.detach(), initial_states=_state(initial_states),
            seq_idx=seq_idx, cu_seqlens=None if cu is None else cu.detach().to(device="cpu", dtype=torch.int64),
            dt_softplus=bool(dt_softplus), dt_limit=tuple(dt_limit), return_final_states=bool(return_final_states))


class SelectiveStateUpdate(nn.Module):
    """transformers' ``selective_state_update`` hook (a Mamba2 mixer's decode step, the state [B, H, P, N]
    updated in place) on kda.torch.selective_state_update: dt, A, D and dt_bias as the mixer passes them
    (expanded from one value per head), no dt clamp (transformers' decode applies none)."""

    def forward(self, state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None,
                **kwargs):
        ok = (_ssd_call(hidden_states, state, B, C, dt, A, D, z, dt_bias) and state.is_contiguous()
              and state.dim() == hidden_states.dim() + 1)
        if not ok:
            return _transformers(self, "selective_state_update", state, hidden_states, dt, A, B, C, D, dt_bias,
                                 dt_softplus, z, **kwargs)
        _COUNTS[("selective_state_update", "kda")] += 1
        d = lambda t: None if t is None else t.detach()  # noqa: E731
        return _kt.selective_state_update(state.detach(), hidden_states.detach(), dt.detach(), A.detach(),
                                          B.detach(), C.detach(), D=d(D), z=d(z), dt_bias=d(dt_bias),
                                          dt_softplus=bool(dt_softplus))


_LAYERS = {
    "chunk_kda": ChunkKda,
    "fused_recurrent_kda": FusedRecurrentKda,
    "chunk_gated_delta_rule": ChunkGatedDeltaRule,
    "fused_recurrent_gated_delta_rule": FusedRecurrentGatedDeltaRule,
    "causal_conv1d_fn": CausalConv1dFn,
    "causal_conv1d_update": CausalConv1dUpdate,
    "RMSNormGated": RMSNormGated,
    "mamba_chunk_scan_combined": MambaChunkScanCombined,
    "selective_state_update": SelectiveStateUpdate,
}


class _Repository:
    """A ``kernels`` repository for one of kda's replacement layers: ``load()`` returns the class."""

    def __init__(self, layer: type):
        self.layer_name = layer.__name__
        self._layer = layer

    def load(self) -> type:
        return self._layer

    def __str__(self) -> str:
        return f"kda ({self.layer_name})"


_REPOSITORIES = {name: _Repository(layer) for name, layer in _LAYERS.items()}


def kernel_mapping() -> dict:
    """kda's ``kernels`` mapping: ``{name: {"cpu": {Mode.INFERENCE: repository}}}`` for every hook it
    replaces (for ``kernels.use_kernel_mapping`` as a context, or ``register_kernel_mapping``)."""
    return {name: {"cpu": {Mode.INFERENCE: repo}} for name, repo in _REPOSITORIES.items()}


def enable() -> None:
    """Registers kda's kernels for transformers' KDA and Gated DeltaNet hooks on the CPU in inference
    mode (``kernels.register_kernel_mapping``). Models loaded afterwards with ``from_pretrained`` on
    the CPU run them; an existing model after ``kernels.kernelize(model, device="cpu",
    mode=Mode.INFERENCE)``."""
    register_kernel_mapping(kernel_mapping())


def disable() -> None:
    """Registers no kda entry for those names on the CPU (other devices' entries stay). A model
    kernelized again afterwards (``kernels.kernelize``, or loaded anew) runs transformers' own code."""
    register_kernel_mapping({name: {"cpu": {}} for name in _REPOSITORIES})
