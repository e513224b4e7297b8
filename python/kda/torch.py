"""The delta-rule kernels as PyTorch custom operators: ``import kda.torch`` registers

- ``torch.ops.kda.chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
  use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
  lower_bound, state_v_first, cu_seqlens, A_log, dt_bias, chunk_size, state_indices,
  return_intermediate_states, kernel, cu_seqlens_cpu=None) -> (o, final_state, h)``: with
  ``state_indices`` the pool ``initial_state`` [S, HV, K, V] is updated in place (declared mutated)
  and ``final_state`` is empty ([0]); otherwise ``final_state`` is a new [N, HV, K, V] when
  ``output_final_state`` (else empty). ``h`` is the intermediate states [B, NT, HV, K, V] in k's
  dtype with ``return_intermediate_states`` (else empty). With ``cu_seqlens`` NT depends on its
  values: ``cu_seqlens_cpu`` (``int[]``, the same values on the host; checked against
  ``cu_seqlens`` when the op runs) gives the fake implementation h's size, so a traced call
  (``torch.compile``, fake tensors) needs it; an eager call reads ``cu_seqlens``.
- ``torch.ops.kda.fused_recurrent_kda_fwd(q, k, v, g, beta, A_log, dt_bias, initial_state, scale,
  output_final_state, inplace_final_state, state_v_first, cu_seqlens, ssm_state_indices,
  num_accepted_tokens, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
  allow_neg_eigval, lower_bound, kernel, out=None) -> (o, final_state)``: ``initial_state`` (declared
  mutated) receives the states with ``inplace_final_state``; otherwise ``final_state`` is a new buffer
  when ``output_final_state`` (else empty). With ``out`` (declared mutated) o is written there and the
  returned o is empty.
- ``torch.ops.kda.fused_kda_gate(g, A_log, dt_bias, lower_bound) -> g_activated``: fla's gate alone
  (see kda.fused_kda_gate), float32 of g's shape; :func:`fused_kda_gate` casts it to ``output_dtype``.
- Gated DeltaNet (g [B, T, HV], a scalar gate per value head):
  ``torch.ops.kda.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
  use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens,
  use_gate_in_kernel, A_log, dt_bias, chunk_size, state_indices, kernel, cu_seqlens_cpu=None) ->
  (o, final_state)`` (the pool form and ``final_state`` as chunk_kda's op);
  ``torch.ops.kda.fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, scale, initial_state,
  inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel,
  A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first,
  output_final_state, kernel, out=None) -> (o, final_state)`` (vLLM's order first; ``initial_state``
  and ``out`` as fused_recurrent_kda_fwd's op); ``torch.ops.kda.fused_gdn_gate(g, A_log, dt_bias) ->
  g_activated`` (float32).

- Mamba2's SSD scan with mamba_ssm's names (see kda.mamba_ssm):
  ``torch.ops.kda.mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
  cu_seqlens, dt_softplus, dt_min, dt_max, kernel) -> (out, final_states, varlen_states)`` (final_states
  [batch, nheads, headdim, dstate] float32; varlen_states [N, ...] with cu_seqlens, else empty);
  ``torch.ops.kda.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
  state_batch_indices, kernel) -> out`` (``state`` declared mutated, updated in place).

They are ``torch.library.custom_op``s over kda's C++ kernels (CPU tensors, read and written in place
through DLPack; no build against torch's headers), with fake implementations so ``torch.compile``
traces them. The functions here (:func:`chunk_kda`, :func:`fused_recurrent_kda`,
:func:`fused_recurrent_kda_fwd`, :func:`fused_kda_gate`, :func:`chunk_gated_delta_rule`,
:func:`fused_recurrent_gated_delta_rule`, :func:`fused_recurrent_gated_delta_rule_fwd`,
:func:`fused_gdn_gate`) wrap them with fla's (and vLLM's) signatures and return values (see
kda.chunk_kda; docs/fla-api.md). The recurrent functions read tensors that require grad and return
results without a graph (fla's recurrent entries have no backward); the chunk functions and the
gates refuse them under grad mode.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _kernels
from . import mamba_ssm as _mamba_ssm

__all__ = ["chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd", "fused_kda_gate", "chunk_gated_delta_rule",
           "fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule_fwd", "fused_gdn_gate",
           "mamba_chunk_scan_combined", "selective_state_update"]


def _empty_state(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,), dtype=torch.float32)  # outputs may not alias an input


def _fake_o_states(q, v, state_v_first: bool, rows=None, o: bool = True, recurrent: bool = False):
    """A fake call's o [B, T, HV, V] in fla's dtype (q's; ``recurrent``: v's; empty [0] when ``o`` is False:
    written into out) and float32 states [rows, HV, K, V] ([rows, HV, V, K] V-first; empty when rows is None)."""
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    out = q.new_empty((B, T, HV, V) if o else (0,), dtype=v.dtype if recurrent else q.dtype)
    if rows is None:
        return out, _empty_state(q)
    return out, q.new_empty((rows, HV, V, K) if state_v_first else (rows, HV, K, V), dtype=torch.float32)


def _num_sequences(q, cu_seqlens):
    return cu_seqlens.shape[0] - 1 if cu_seqlens is not None else q.shape[0]


@torch.library.custom_op("kda::chunk_kda", mutates_args=("initial_state",), device_types="cpu")
def _chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               scale: Optional[float], initial_state: Optional[torch.Tensor], output_final_state: bool,
               use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool,
               allow_neg_eigval: bool, safe_gate: bool, lower_bound: Optional[float], state_v_first: bool,
               cu_seqlens: Optional[torch.Tensor], A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
               chunk_size: int, state_indices: Optional[torch.Tensor], return_intermediate_states: bool,
               kernel: str, cu_seqlens_cpu: Optional[Sequence[int]] = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    extra = {} if state_indices is None else {"state_indices": state_indices}
    out = _kernels.chunk_kda(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        safe_gate=safe_gate, lower_bound=lower_bound, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
        A_log=A_log, dt_bias=dt_bias, chunk_size=chunk_size, return_intermediate_states=return_intermediate_states,
        kernel=kernel, cu_seqlens_cpu=cu_seqlens_cpu, **extra)
    o, final = out[0], out[1]
    h = out[2] if return_intermediate_states else k.new_empty((0,))
    if state_indices is not None or final is None:
        final = _empty_state(q)
    return o, final, h


@_chunk_kda.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
      use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound, state_v_first, cu_seqlens, A_log,
      dt_bias, chunk_size, state_indices, return_intermediate_states, kernel, cu_seqlens_cpu=None):
    rows = _num_sequences(q, cu_seqlens) if state_indices is None and output_final_state else None
    o, final = _fake_o_states(q, v, state_v_first, rows)
    h = k.new_empty((0,))
    if return_intermediate_states:
        B, T, _, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        inner = (V, K) if state_v_first else (K, V)
        h = k.new_empty((B, _num_chunks(T, chunk_size, cu_seqlens, cu_seqlens_cpu), HV, *inner))
    return o, final, h


def _num_chunks(T, chunk_size: int, cu_seqlens, cu_seqlens_cpu):
    """NT of h in the fake: from T without cu_seqlens; with it from cu_seqlens' values, which a fake
    tensor does not have, so from their host copy cu_seqlens_cpu (ints, or SymInts a trace read from a
    tensor). The real op checks that copy against cu_seqlens."""
    if cu_seqlens is None:
        return (T + chunk_size - 1) // chunk_size
    if cu_seqlens_cpu is None:
        raise ValueError("chunk_kda: return_intermediate_states with cu_seqlens needs cu_seqlens_cpu= (cu_seqlens' "
                         "values on the host, as fla takes them) when traced (torch.compile, fake tensors): h's "
                         "number of chunks depends on those values")
    torch._check_value(len(cu_seqlens_cpu) == cu_seqlens.shape[0],
                       lambda: f"chunk_kda: cu_seqlens_cpu: expected cu_seqlens' {cu_seqlens.shape[0]} values, got "
                       f"{len(cu_seqlens_cpu)}")
    for i in range(len(cu_seqlens_cpu) - 1):
        torch._check_value(cu_seqlens_cpu[i + 1] >= cu_seqlens_cpu[i],
                           lambda: "chunk_kda: cu_seqlens_cpu: must be non-decreasing")
    return _kernels.chunk_count(list(cu_seqlens_cpu), chunk_size)


@torch.library.custom_op("kda::chunk_gated_delta_rule", mutates_args=("initial_state",), device_types="cpu")
def _chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                            scale: Optional[float], initial_state: Optional[torch.Tensor], output_final_state: bool,
                            use_qk_l2norm_in_kernel: bool, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool,
                            state_v_first: bool, cu_seqlens: Optional[torch.Tensor], use_gate_in_kernel: bool,
                            A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor], chunk_size: int,
                            state_indices: Optional[torch.Tensor], kernel: str,
                            cu_seqlens_cpu: Optional[Sequence[int]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    extra = {} if state_indices is None else {"state_indices": state_indices}
    o, final = _kernels.chunk_gated_delta_rule(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
        chunk_size=chunk_size, kernel=kernel, **extra)
    if state_indices is not None or final is None:
        final = _empty_state(q)
    return o, final


@_chunk_gated_delta_rule.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
      allow_neg_eigval, state_v_first, cu_seqlens, use_gate_in_kernel, A_log, dt_bias, chunk_size, state_indices,
      kernel, cu_seqlens_cpu=None):
    rows = _num_sequences(q, cu_seqlens) if state_indices is None and output_final_state else None
    return _fake_o_states(q, v, state_v_first, rows)


def _recurrent_results(q, o, final, out, inplace_final_state):
    """A recurrent op's results: o empty when it was written into out, final_state empty when the states
    went into initial_state or were not asked for (outputs may not alias an input)."""
    if out is not None:
        o = q.new_empty((0,))
    if inplace_final_state or final is None:
        final = _empty_state(q)
    return o, final


def _recurrent_fake(q, v, output_final_state, inplace_final_state, state_v_first, cu_seqlens, ssm_state_indices, out):
    rows = None
    if output_final_state and not inplace_final_state:
        rows = q.shape[0] * q.shape[1] if ssm_state_indices is not None else _num_sequences(q, cu_seqlens)
    return _fake_o_states(q, v, state_v_first, rows, o=out is None, recurrent=True)


@torch.library.custom_op("kda::fused_recurrent_kda_fwd", mutates_args=("initial_state", "out"), device_types="cpu")
def _fused_recurrent_kda_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                             A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                             initial_state: Optional[torch.Tensor], scale: Optional[float], output_final_state: bool,
                             inplace_final_state: bool, state_v_first: bool, cu_seqlens: Optional[torch.Tensor],
                             ssm_state_indices: Optional[torch.Tensor], num_accepted_tokens: Optional[torch.Tensor],
                             use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool,
                             use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, lower_bound: Optional[float],
                             kernel: str, out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    o, final = _kernels.fused_recurrent_kda_fwd(
        q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state, scale=scale,
        output_final_state=output_final_state, inplace_final_state=inplace_final_state, state_v_first=state_v_first,
        cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        lower_bound=lower_bound, kernel=kernel, out=out)
    return _recurrent_results(q, o, final, out, inplace_final_state)


@_fused_recurrent_kda_fwd.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state, inplace_final_state, state_v_first,
      cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
      use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, kernel, out=None):
    return _recurrent_fake(q, v, output_final_state, inplace_final_state, state_v_first, cu_seqlens,
                           ssm_state_indices, out)


@torch.library.custom_op("kda::fused_recurrent_gated_delta_rule_fwd", mutates_args=("initial_state", "out"),
                         device_types="cpu")
def _fused_recurrent_gated_delta_rule_fwd(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: Optional[float],
        initial_state: Optional[torch.Tensor], inplace_final_state: bool, cu_seqlens: Optional[torch.Tensor],
        ssm_state_indices: Optional[torch.Tensor], num_accepted_tokens: Optional[torch.Tensor],
        use_qk_l2norm_in_kernel: bool, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
        use_gate_in_kernel: bool, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool, state_v_first: bool,
        output_final_state: bool, kernel: str, out: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    o, final = _kernels.fused_recurrent_gated_delta_rule_fwd(
        q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
        num_accepted_tokens, None, use_qk_l2norm_in_kernel, A_log=A_log, dt_bias=dt_bias,
        use_gate_in_kernel=use_gate_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        allow_neg_eigval=allow_neg_eigval, state_v_first=state_v_first, output_final_state=output_final_state,
        out=out, kernel=kernel)
    return _recurrent_results(q, o, final, out, inplace_final_state)


@_fused_recurrent_gated_delta_rule_fwd.register_fake
def _(q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
      use_qk_l2norm_in_kernel, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
      state_v_first, output_final_state, kernel, out=None):
    return _recurrent_fake(q, v, output_final_state, inplace_final_state, state_v_first, cu_seqlens,
                           ssm_state_indices, out)


@torch.library.custom_op("kda::fused_kda_gate", mutates_args=(), device_types="cpu")
def _fused_kda_gate(g: torch.Tensor, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                    lower_bound: Optional[float]) -> torch.Tensor:
    return _kernels.fused_kda_gate(g, A_log, dt_bias, lower_bound=lower_bound)


@_fused_kda_gate.register_fake
def _(g, A_log, dt_bias, lower_bound):
    return g.new_empty(g.shape, dtype=torch.float32)


@torch.library.custom_op("kda::fused_gdn_gate", mutates_args=(), device_types="cpu")
def _fused_gdn_gate(g: torch.Tensor, A_log: torch.Tensor, dt_bias: Optional[torch.Tensor]) -> torch.Tensor:
    return _kernels.fused_gdn_gate(g, A_log, dt_bias)


@_fused_gdn_gate.register_fake
def _(g, A_log, dt_bias):
    return g.new_empty(g.shape, dtype=torch.float32)


def fused_kda_gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=torch.float32):
    """fla's ``fused_kda_gate`` through ``torch.ops.kda.fused_kda_gate`` (see kda.fused_kda_gate): the
    activated gate, float32 math, returned as ``output_dtype``. Tensors that require grad are refused
    under grad mode (fla differentiates the gate)."""
    _kernels.check_gate_form(A_log, lower_bound)  # before the op, which a trace runs only as its fake
    _kernels._check_grad("fused_kda_gate", g=g, A_log=A_log, dt_bias=dt_bias)
    y = torch.ops.kda.fused_kda_gate(g, A_log, dt_bias, _float(lower_bound))
    return y if output_dtype is None else y.to(output_dtype)


def fused_gdn_gate(g, A_log, dt_bias=None, output_dtype=torch.float32):
    """fla's ``fused_gdn_gate`` through ``torch.ops.kda.fused_gdn_gate`` (see kda.fused_gdn_gate):
    ``-exp(A_log) * softplus(g + dt_bias)`` for g [..., HV], float32 math, returned as ``output_dtype``.
    Tensors that require grad are refused under grad mode (fla differentiates the gate)."""
    if A_log is None:
        raise ValueError("fused_gdn_gate: A_log is required")
    _kernels._check_grad("fused_gdn_gate", g=g, A_log=A_log, dt_bias=dt_bias)
    y = torch.ops.kda.fused_gdn_gate(g, A_log, dt_bias)
    return y if output_dtype is None else y.to(output_dtype)


def _float(x):
    return None if x is None else float(x)


def _no_graph(x):
    """A recurrent entry's tensor argument, detached when it requires grad: fla's recurrent entries have no
    backward, so they read such tensors and return results without a graph (the data is shared: a pool
    is still updated in place)."""
    return x.detach() if isinstance(x, torch.Tensor) and x.requires_grad else x


def _host_ints(x, who: str = "chunk_kda"):
    """cu_seqlens_cpu as the op's int list: a tensor's values read on the host (traced by torch.compile
    as scalar reads, so h's size is an expression of them), or a sequence of ints as it is (constants
    under torch.compile: a static size). None without cu_seqlens (fla reads it only with cu_seqlens)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        if x.dim() != 1 or x.is_floating_point() or x.is_complex():
            raise ValueError(f"{who}: cu_seqlens_cpu: expected a 1-D integer tensor [N + 1], got "
                             f"{list(x.shape)} {x.dtype}")
        return x.tolist()
    return [int(v) for v in x]


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    """fla's ``chunk_kda`` through ``torch.ops.kda.chunk_kda`` (keywords as kda.chunk_kda): returns
    ``(o, final_state or None)``, the pool itself as the final state with ``state_indices``, and h
    third with ``return_intermediate_states``.

    ``cu_seqlens_cpu`` (cu_seqlens' values on the host: a CPU tensor or a sequence of ints; checked
    against cu_seqlens when the op runs) sizes h under ``torch.compile``, where h's number of chunks
    cannot be read from cu_seqlens: ``return_intermediate_states`` with ``cu_seqlens`` needs it there (a
    ValueError naming it otherwise). Python ints give a static size; a tensor's values are read in the
    graph. Eager calls do without it."""
    state_v_first = _kernels._chunk_keywords(state_v_first, cp_context, return_intermediate_states, disable_recompute,
                                             kwargs, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    state_indices = kwargs.get("state_indices")
    inter = bool(return_intermediate_states)
    o, final, h = torch.ops.kda.chunk_kda(
        q, k, v, g, beta, _float(scale), initial_state, bool(output_final_state), bool(use_qk_l2norm_in_kernel),
        bool(use_gate_in_kernel), bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(safe_gate),
        _float(lower_bound), bool(state_v_first), cu_seqlens, kwargs.get("A_log"), kwargs.get("dt_bias"),
        int(kwargs.get("chunk_size", 64)), state_indices, inter, kwargs.get("kernel", "auto"),
        _host_ints(None if cu_seqlens is None else cu_seqlens_cpu))
    final = _chunk_final(final, initial_state, output_final_state, state_indices)
    return (o, final, h) if inter else (o, final)


def _chunk_final(final, initial_state, output_final_state, state_indices):
    """A chunk op's final state as fla returns it: None unless asked; the pool itself in the pool form."""
    if not output_final_state:
        return None
    return initial_state if state_indices is not None else final


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """fla's ``chunk_gated_delta_rule`` through ``torch.ops.kda.chunk_gated_delta_rule`` (keywords as
    kda.chunk_gated_delta_rule): returns ``(o, final_state or None)``, the pool itself as the final
    state with ``state_indices``. ``cu_seqlens_cpu`` is checked against cu_seqlens when the op runs;
    ``chunk_indices`` is a hint."""
    state_v_first = _kernels._gdn_chunk_keywords(state_v_first, cp_context, kwargs, q=q, k=k, v=v, g=g, beta=beta,
                                                 initial_state=initial_state)
    state_indices = kwargs.get("state_indices")
    o, final = torch.ops.kda.chunk_gated_delta_rule(
        q, k, v, g, beta, _float(scale), initial_state, bool(output_final_state), bool(use_qk_l2norm_in_kernel),
        bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(state_v_first), cu_seqlens,
        bool(kwargs.get("use_gate_in_kernel", False)), kwargs.get("A_log"), kwargs.get("dt_bias"),
        int(kwargs.get("chunk_size", 64)), state_indices, kwargs.get("kernel", "auto"),
        _host_ints(None if cu_seqlens is None else cu_seqlens_cpu, "chunk_gated_delta_rule"))
    return o, _chunk_final(final, initial_state, output_final_state, state_indices)


def _check_out(who: str, out, q, v) -> None:
    """``out`` of a recurrent entry: a torch tensor of v's shape and dtype (refused before the op writes)."""
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{who}: out: expected a torch tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(v.shape) or out.dtype != v.dtype:
        raise ValueError(f"{who}: out: expected shape {list(v.shape)} and dtype {v.dtype} (v's), got "
                         f"{list(out.shape)} {out.dtype}")


def _fwd_results(o, final, out, initial_state, inplace_final_state, output_final_state):
    """A recurrent op's results as the _fwd entries return them: out itself as o when given; initial_state
    itself with inplace_final_state, else the new states or None."""
    if out is not None:
        o = out
    if inplace_final_state:
        return o, initial_state
    return o, (final if output_final_state else None)


def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                            output_final_state=False, inplace_final_state=True, state_v_first=False,
                            cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, out=None,
                            **kwargs):
    """vLLM's ``fused_recurrent_kda_fwd`` through ``torch.ops.kda.fused_recurrent_kda_fwd`` (see
    kda.fused_recurrent_kda_fwd): returns ``(o, final_state)``; with ``out`` the op writes o there in
    place and ``out`` itself is returned as o. Tensors that require grad are read; the results have
    no graph."""
    state_v_first = _kernels._fwd_keywords(state_v_first, kwargs)
    _check_out("fused_recurrent_kda_fwd", out, q, v)
    q, k, v, g, beta, a_log, bias, state, buf = (_no_graph(x) for x in (q, k, v, g, beta, A_log, dt_bias,
                                                                        initial_state, out))
    o, final = torch.ops.kda.fused_recurrent_kda_fwd(
        q, k, v, g, beta, a_log, bias, state, _float(scale), bool(output_final_state),
        bool(inplace_final_state), bool(state_v_first), cu_seqlens, ssm_state_indices, num_accepted_tokens,
        bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel), bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval), _float(lower_bound), kwargs.get("kernel", "auto"), buf)
    return _fwd_results(o, final, out, initial_state, inplace_final_state, output_final_state)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's public ``fused_recurrent_kda`` (see kda.fused_recurrent_kda): contiguous states, the pool
    keywords of :func:`fused_recurrent_kda_fwd` honoured. Returns ``(o, final_state or None)``."""
    return _kernels.public_recurrent(fused_recurrent_kda_fwd, q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
                                     output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                                     use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first,
                                     cu_seqlens, kwargs)


def fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True,
                                         cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                         retrieve_parent_token=None, use_qk_l2norm_in_kernel=False, *, A_log=None,
                                         dt_bias=None, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                                         allow_neg_eigval=False, state_v_first=False, output_final_state=True,
                                         out=None, **kwargs):
    """vLLM's ``fused_recurrent_gated_delta_rule_fwd`` through
    ``torch.ops.kda.fused_recurrent_gated_delta_rule_fwd`` (see kda.fused_recurrent_gated_delta_rule_fwd;
    output_final_state defaults to True, as vLLM returns the states): returns ``(o, final_state)``, with
    ``out`` written in place and returned as o. Tensors that require grad are read; the results have no
    graph."""
    who = "fused_recurrent_gated_delta_rule_fwd"
    state_v_first = _kernels._fwd_keywords(state_v_first, kwargs, who=who, hints=_kernels._GDN_HINTS)
    _kernels.refuse_tree(retrieve_parent_token)
    _check_out(who, out, q, v)
    q, k, v, g, beta, a_log, bias, state, buf = (_no_graph(x) for x in (q, k, v, g, beta, A_log, dt_bias,
                                                                        initial_state, out))
    o, final = torch.ops.kda.fused_recurrent_gated_delta_rule_fwd(
        q, k, v, g, beta, _float(scale), state, bool(inplace_final_state), cu_seqlens, ssm_state_indices,
        num_accepted_tokens, bool(use_qk_l2norm_in_kernel), a_log, bias, bool(use_gate_in_kernel),
        bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(state_v_first), bool(output_final_state),
        kwargs.get("kernel", "auto"), buf)
    return _fwd_results(o, final, out, initial_state, inplace_final_state, output_final_state)


# public_gdn_recurrent's arrays in torch (traced by torch.compile): what it derives from the inputs has no graph.
_GATE_OPS = _kernels.GateOps(
    full=lambda shape, value: torch.full(shape, value, dtype=torch.float32),
    f32=lambda x: _no_graph(x).float(),
    gate=lambda g, a, b: torch.ops.kda.fused_gdn_gate(_no_graph(g), _no_graph(a), _no_graph(b)))


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, **kwargs):
    """fla's public ``fused_recurrent_gated_delta_rule`` (see kda.fused_recurrent_gated_delta_rule):
    g, gk (both: the decays multiplied), neither (no decay); contiguous states, the pool keywords of
    :func:`fused_recurrent_gated_delta_rule_fwd` honoured. Returns ``(o, final_state or None)``."""
    return _kernels.public_gdn_recurrent(fused_recurrent_gated_delta_rule_fwd, _GATE_OPS, q, k, v, g, gk, gv, beta,
                                         scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                                         use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                                         allow_neg_eigval, state_v_first, cu_seqlens, kwargs)


@torch.library.custom_op("kda::mamba_chunk_scan_combined", mutates_args=(), device_types="cpu")
def _mamba_chunk_scan_combined(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                               chunk_size: int, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                               dt_bias: Optional[torch.Tensor], initial_states: Optional[torch.Tensor],
                               seq_idx: Optional[torch.Tensor], cu_seqlens: Optional[torch.Tensor], dt_softplus: bool,
                               dt_min: float, dt_max: float, kernel: str
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    varlen = cu_seqlens is not None
    res = _mamba_ssm.mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states, seq_idx=seq_idx,
        cu_seqlens=cu_seqlens, dt_softplus=dt_softplus, dt_limit=(dt_min, dt_max), return_final_states=True,
        return_varlen_states=varlen, kernel=kernel)
    return res[0], res[1], res[2] if varlen else _empty_state(x)


@_mamba_chunk_scan_combined.register_fake
def _(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, dt_softplus, dt_min, dt_max,
      kernel):
    b, _, h, p = x.shape
    n = B.shape[-1]
    final = x.new_empty((b, h, p, n), dtype=torch.float32)
    varlen = _empty_state(x) if cu_seqlens is None else x.new_empty((cu_seqlens.shape[0] - 1, h, p, n),
                                                                     dtype=torch.float32)
    return x.new_empty(x.shape), final, varlen


@torch.library.custom_op("kda::selective_state_update", mutates_args=("state",), device_types="cpu")
def _selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                            C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                            dt_bias: Optional[torch.Tensor], dt_softplus: bool,
                            state_batch_indices: Optional[torch.Tensor], kernel: str) -> torch.Tensor:
    return _mamba_ssm.selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                                             dt_softplus=dt_softplus, state_batch_indices=state_batch_indices,
                                             kernel=kernel)


@_selective_state_update.register_fake
def _(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, kernel):
    return x.new_empty(x.shape)


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False, *, kernel="auto"):
    """mamba_ssm's ``mamba_chunk_scan_combined`` through ``torch.ops.kda.mamba_chunk_scan_combined`` (see
    kda.mamba_ssm.mamba_chunk_scan_combined): ``out``, with ``return_final_states`` and
    ``return_varlen_states`` (needs cu_seqlens) also those states, as mamba_ssm returns them."""
    who = "mamba_chunk_scan_combined"
    lo, hi = _mamba_ssm._dt_limit(who, dt_limit)
    if return_varlen_states and cu_seqlens is None:
        raise ValueError(f"{who}: return_varlen_states needs cu_seqlens")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{who}: chunk_size: expected a positive int, got {chunk_size!r}")
    out, final, varlen = torch.ops.kda.mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, bool(dt_softplus), lo, hi,
        kernel)
    results = [out] + ([final] if return_final_states else []) + ([varlen] if return_varlen_states else [])
    return results[0] if len(results) == 1 else tuple(results)


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, *, kernel="auto"):
    """mamba_ssm's ``selective_state_update`` through ``torch.ops.kda.selective_state_update`` (see
    kda.mamba_ssm.selective_state_update): ``state`` updated in place; returns out."""
    return torch.ops.kda.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus),
                                                state_batch_indices, kernel)
