"""The KDA kernels with fla's signatures over numpy, torch CPU and JAX CPU arrays."""

from __future__ import annotations

import numpy as np

from . import _core
from ._arrays import (
    empty_like_framework,
    for_core,
    for_core_writable,
    int_array,
    is_torch,
    np_dtype,
    param_f32,
    shape_of,
)


def _scale(scale) -> float:
    if scale is None:
        return 0.0  # the core's K^-0.5
    s = float(scale)
    if not s > 0 or not np.isfinite(s):
        raise ValueError(f"scale: must be a finite number > 0 (None: K^-0.5), got {scale!r}")
    return s


def _token_shapes(q, v):
    qs, vs = shape_of(q, "q"), shape_of(v, "v")
    if len(qs) != 4:
        raise ValueError(f"q: expected a 4-D array [B, T, H, K], got shape {list(qs)}")
    if len(vs) != 4:
        raise ValueError(f"v: expected a 4-D array [B, T, H, V], got shape {list(vs)}")
    return qs, vs


def _gate_params(use_gate_in_kernel, A_log, dt_bias):
    if not use_gate_in_kernel:
        return None, None
    return (None if A_log is None else param_f32(A_log, "A_log"),
            None if dt_bias is None else param_f32(dt_bias, "dt_bias"))


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, cu_seqlens=None, A_log=None,
              dt_bias=None, state_indices=None, *, kernel="auto"):
    """Chunked KDA prefill (fla's ``chunk_kda``).

    q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``, beta ``[B, T, H]``: float32 or bfloat16 (q, k, v one
    dtype). With ``cu_seqlens`` (``[N + 1]``, integers) B must be 1 and the T tokens are N packed
    sequences; without it the B rows are N = B sequences of T tokens. ``g`` is the log decay, or the
    raw gate with ``use_gate_in_kernel`` (then ``A_log`` [H] and optionally ``dt_bias`` [H*K]).

    States are float32 ``[N, H, K, V]``: ``initial_state`` (None: zeros) is read, and the final state is
    returned when ``output_final_state``. With ``state_indices`` ([N] integers, negative: padding)
    ``initial_state`` is a pool ``[S, H, K, V]``: sequence n reads and writes
    ``initial_state[state_indices[n]]`` in place, and the pool itself is returned as the final state.

    Returns ``(o, final_state or None)``; o ``[B, T, H, V]`` has q's dtype. Outputs are torch tensors
    when q is one, else numpy arrays. ``kernel``: "auto" | "reference" | "optimized".
    """
    qs, vs = _token_shapes(q, v)
    B, T, H, K = qs
    V = vs[3]
    if cu_seqlens is not None:
        cu = int_array(cu_seqlens, "cu_seqlens", np.int64)
        if B != 1:
            raise ValueError(f"q: with cu_seqlens the batch must be packed as B = 1, got shape {list(qs)}")
        if cu.ndim != 1 or cu.size < 2:
            raise ValueError(f"cu_seqlens: expected shape [N + 1] with N >= 1, got {list(cu.shape)}")
    else:
        if B < 1:
            raise ValueError(f"q: chunk_kda needs at least one sequence (B >= 1), got shape {list(qs)}")
        cu = np.arange(B + 1, dtype=np.int64) * T
    N = cu.size - 1
    qdt = np_dtype(q)
    o = empty_like_framework(q, (B, T, H, V), qdt if qdt is not None else np.dtype(np.float32))
    a_log, dt = _gate_params(use_gate_in_kernel, A_log, dt_bias)
    common = dict(scale=_scale(scale), use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel),
                  use_gate_in_kernel=bool(use_gate_in_kernel), A_log=a_log, dt_bias=dt, kernel=kernel)
    args = [for_core(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta"))]
    if state_indices is not None:
        if initial_state is None:
            raise ValueError("initial_state: state_indices needs the state pool initial_state [S, H, K, V]")
        pool = for_core_writable(initial_state, "initial_state")
        idx = int_array(state_indices, "state_indices", np.int32)
        _core.chunk_kda_into(for_core(o, "o"), None, pool, *args, cu, None, idx, **common)
        return o, (initial_state if output_final_state else None)
    final = empty_like_framework(q, (N, H, K, V), np.dtype(np.float32)) if output_final_state else None
    init = None if initial_state is None else for_core(initial_state, "initial_state")
    _core.chunk_kda_into(for_core(o, "o"), None if final is None else for_core(final, "final_state"), None, *args,
                         cu, init, None, **common)
    return o, final


def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True,
                        cu_seqlens=None, ssm_state_indices=None, use_qk_l2norm_in_kernel=False,
                        use_gate_in_kernel=False, A_log=None, dt_bias=None, *, kernel="auto"):
    """One decode step (fla's / vLLM's ``fused_recurrent_kda``): one token per sequence.

    q, k, g ``[B, T, H, K]``, v ``[B, T, H, V]``, beta ``[B, T, H]``. The N tokens are either
    ``[N, 1, ...]`` (no cu_seqlens) or packed ``[1, N, ...]`` with ``cu_seqlens = [0, 1, ..., N]``.
    Sequence n uses state ``initial_state[ssm_state_indices[n]]`` of the float32 pool
    ``[S, H, K, V]`` (indices default to 0..N-1; a negative index is padding: output zero, no state
    touched). With ``inplace_final_state`` the pool is updated in place and returned as the final
    state; otherwise it is left alone and a new ``[N, H, K, V]`` holding each sequence's updated state
    (zeros for padding) is returned. ``initial_state`` None starts every sequence from zeros.

    Returns ``(o, final_state)``; o ``[B, T, H, V]`` has q's dtype (torch if q is, else numpy).
    """
    qs, vs = _token_shapes(q, v)
    B, T, H, K = qs
    V = vs[3]
    N = B * T
    if cu_seqlens is not None:
        cu = int_array(cu_seqlens, "cu_seqlens", np.int64)
        if B != 1:
            raise ValueError(f"q: with cu_seqlens the batch must be packed as B = 1, got shape {list(qs)}")
        if cu.shape != (N + 1,) or not np.array_equal(cu, np.arange(N + 1)):
            raise ValueError("cu_seqlens: fused_recurrent_kda decodes one token per sequence, so cu_seqlens must "
                             f"be [0, 1, ..., {N}] for q of shape {list(qs)}")
    elif T != 1:
        raise ValueError(f"q: fused_recurrent_kda decodes one token per sequence: expected [N, 1, H, K] (or "
                         f"[1, N, H, K] with cu_seqlens [0, 1, ..., N]), got shape {list(qs)}")
    if ssm_state_indices is not None:
        if initial_state is None:
            raise ValueError("initial_state: ssm_state_indices needs the state pool initial_state [S, H, K, V]")
        idx = int_array(ssm_state_indices, "ssm_state_indices", np.int32)
    else:
        idx = np.arange(N, dtype=np.int32)
    qdt = np_dtype(q)
    o = empty_like_framework(q, (B, T, H, V), qdt if qdt is not None else np.dtype(np.float32))
    a_log, dt = _gate_params(use_gate_in_kernel, A_log, dt_bias)
    args = [for_core(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta"))]
    common = dict(scale=_scale(scale), use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel),
                  use_gate_in_kernel=bool(use_gate_in_kernel), A_log=a_log, dt_bias=dt, kernel=kernel)
    if initial_state is None:
        state = empty_like_framework(q, (N, H, K, V), np.dtype(np.float32), zero=True)
    elif inplace_final_state:
        state = initial_state
        for_core_writable(state, "initial_state")
    else:
        # A new [N, H, K, V]: sequence n's state gathered from the pool, updated there.
        ss = shape_of(initial_state, "initial_state")
        if len(ss) != 4 or ss[1:] != (H, K, V):
            raise ValueError(f"initial_state: expected shape [S, H, K, V] = [S, {H}, {K}, {V}], got {list(ss)}")
        if idx.shape != (N,):
            raise ValueError(f"ssm_state_indices: expected shape [N] = [{N}], got {list(idx.shape)}")
        if idx.size and idx.max() >= ss[0]:
            raise ValueError(f"ssm_state_indices: index {int(idx.max())} is out of range for num_states = {ss[0]} "
                             "(use a negative index for padding)")
        valid = np.nonzero(idx >= 0)[0]
        state = empty_like_framework(q, (N, H, K, V), np.dtype(np.float32), zero=True)
        if is_torch(state):
            import torch

            src = initial_state if is_torch(initial_state) else torch.from_numpy(np.asarray(initial_state))
            state[torch.from_numpy(valid)] = src.detach()[torch.from_numpy(idx[valid].astype(np.int64))].float()
        else:
            state[valid] = np.asarray(initial_state)[idx[valid]]
        idx = np.where(idx >= 0, np.arange(N, dtype=np.int32), -1).astype(np.int32)
    _core.fused_recurrent_kda_into(for_core(o, "o"), for_core_writable(state, "initial_state"), *args, idx, **common)
    return o, state
