"""The KDA kernels as PyTorch custom operators: ``import kda.torch`` registers

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

They are ``torch.library.custom_op``s over kda's C++ kernels (CPU tensors, read and written in place
through DLPack; no build against torch's headers), with fake implementations so ``torch.compile``
traces them. :func:`chunk_kda`, :func:`fused_recurrent_kda` and :func:`fused_recurrent_kda_fwd` here
wrap them with fla's signatures and return values (see kda.chunk_kda; docs/fla-api.md).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _kernels

__all__ = ["chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd", "fused_kda_gate"]


def _empty_state(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,), dtype=torch.float32)  # outputs may not alias an input


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
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = q.new_empty((B, T, HV, V))
    inner = (V, K) if state_v_first else (K, V)
    h = k.new_empty((0,))
    if return_intermediate_states:
        h = k.new_empty((B, _num_chunks(T, chunk_size, cu_seqlens, cu_seqlens_cpu), HV, *inner))
    if state_indices is None and output_final_state:
        N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
        return o, q.new_empty((N, HV, *inner), dtype=torch.float32), h
    return o, _empty_state(q), h


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
    if out is not None:
        o = q.new_empty((0,))  # o was written into out, which the result may not alias
    if inplace_final_state or final is None:
        final = _empty_state(q)
    return o, final


@_fused_recurrent_kda_fwd.register_fake
def _(q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state, inplace_final_state, state_v_first,
      cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
      use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, kernel, out=None):
    B, T, _, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = q.new_empty((B, T, HV, V) if out is None else (0,))
    if inplace_final_state or not output_final_state:
        return o, _empty_state(q)
    rows = B * T if ssm_state_indices is not None else (cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B)
    return o, q.new_empty((rows, HV, V, K) if state_v_first else (rows, HV, K, V), dtype=torch.float32)


@torch.library.custom_op("kda::fused_kda_gate", mutates_args=(), device_types="cpu")
def _fused_kda_gate(g: torch.Tensor, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                    lower_bound: Optional[float]) -> torch.Tensor:
    return _kernels.fused_kda_gate(g, A_log, dt_bias, lower_bound=lower_bound)


@_fused_kda_gate.register_fake
def _(g, A_log, dt_bias, lower_bound):
    return g.new_empty(g.shape, dtype=torch.float32)


def fused_kda_gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=torch.float32):
    """fla's ``fused_kda_gate`` through ``torch.ops.kda.fused_kda_gate`` (see kda.fused_kda_gate): the
    activated gate, float32 math, returned as ``output_dtype``."""
    _kernels.check_gate_form(A_log, lower_bound)  # before the op, which a trace runs only as its fake
    y = torch.ops.kda.fused_kda_gate(g, A_log, dt_bias, _float(lower_bound))
    return y if output_dtype is None else y.to(output_dtype)


def _float(x):
    return None if x is None else float(x)


def _host_ints(x):
    """cu_seqlens_cpu as the op's int list: a tensor's values read on the host (traced by torch.compile
    as scalar reads, so h's size is an expression of them), or a sequence of ints as it is (constants
    under torch.compile: a static size)."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 1 or x.is_floating_point() or x.is_complex():
            raise ValueError(f"chunk_kda: cu_seqlens_cpu: expected a 1-D integer tensor [N + 1], got "
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
    # As fla: read only with cu_seqlens.
    host = None if cu_seqlens is None or cu_seqlens_cpu is None else _host_ints(cu_seqlens_cpu)
    o, final, h = torch.ops.kda.chunk_kda(
        q, k, v, g, beta, _float(scale), initial_state, bool(output_final_state), bool(use_qk_l2norm_in_kernel),
        bool(use_gate_in_kernel), bool(use_beta_sigmoid_in_kernel), bool(allow_neg_eigval), bool(safe_gate),
        _float(lower_bound), bool(state_v_first), cu_seqlens, kwargs.get("A_log"), kwargs.get("dt_bias"),
        int(kwargs.get("chunk_size", 64)), state_indices, inter, kwargs.get("kernel", "auto"), host)
    if not output_final_state:
        final = None
    elif state_indices is not None:
        final = initial_state
    return (o, final, h) if inter else (o, final)


def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                            output_final_state=False, inplace_final_state=True, state_v_first=False,
                            cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, out=None,
                            **kwargs):
    """vLLM's ``fused_recurrent_kda_fwd`` through ``torch.ops.kda.fused_recurrent_kda_fwd`` (see
    kda.fused_recurrent_kda_fwd): returns ``(o, final_state)``; with ``out`` the op writes o there in
    place and ``out`` itself is returned as o."""
    who = "fused_recurrent_kda_fwd"
    state_v_first = _kernels._fwd_keywords(state_v_first, kwargs, q=q, k=k, v=v, g=g, beta=beta,
                                           initial_state=initial_state, A_log=A_log, dt_bias=dt_bias)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{who}: out: expected a torch tensor, got {type(out).__name__}")
        if tuple(out.shape) != tuple(v.shape) or out.dtype != q.dtype:
            raise ValueError(f"{who}: out: expected shape {list(v.shape)} and dtype {q.dtype} (v's shape, q's "
                             f"dtype), got {list(out.shape)} {out.dtype}")
    o, final = torch.ops.kda.fused_recurrent_kda_fwd(
        q, k, v, g, beta, A_log, dt_bias, initial_state, _float(scale), bool(output_final_state),
        bool(inplace_final_state), bool(state_v_first), cu_seqlens, ssm_state_indices, num_accepted_tokens,
        bool(use_qk_l2norm_in_kernel), bool(use_gate_in_kernel), bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval), _float(lower_bound), kwargs.get("kernel", "auto"), out)
    if out is not None:
        o = out
    if inplace_final_state:
        return o, initial_state
    return o, (final if output_final_state else None)


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
