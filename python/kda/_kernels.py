"""The KDA kernels with fla's signatures over numpy, torch CPU and JAX CPU arrays.

Every check of the arguments is the C++ call description's (kda/kernels/kda_args.h), reached through
``_core.chunk_kda`` / ``_core.fused_recurrent_kda``, whose messages surface unchanged. What stays here
is Python's: converting arrays for the core (bf16 bit views, index lists, small float parameters),
fla's defaults, and allocating the outputs in the caller's framework. A call first asks the core for
the sizes it implies (``check_only``), allocates, then runs.
"""

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
    spec_of,
)


def _common(q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
            kernel) -> dict:
    """The arguments both kernels share, converted for the core."""
    args = {n: for_core(x, n) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))}
    gate = bool(use_gate_in_kernel)
    args.update(
        scale=None if scale is None else float(scale),
        cu_seqlens=None if cu_seqlens is None else int_array(cu_seqlens, "cu_seqlens", np.int64),
        use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), use_gate_in_kernel=gate,
        # As fla: A_log and dt_bias only matter with the gate in the kernel.
        A_log=param_f32(A_log, "A_log") if gate and A_log is not None else None,
        dt_bias=param_f32(dt_bias, "dt_bias") if gate and dt_bias is not None else None,
        kernel=kernel)
    return args


def _output(q, s: dict):
    """o [B, T, H, V] in q's dtype (checked by the core), in q's framework."""
    return empty_like_framework(q, (s["B"], s["T"], s["H"], s["V"]), np_dtype(q))


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
    ``initial_state`` is a pool ``[S, H, K, V]`` (the core's ``state``): sequence n reads and writes
    ``initial_state[state_indices[n]]`` in place, and the pool itself is returned as the final state.

    Returns ``(o, final_state or None)``; o ``[B, T, H, V]`` has q's dtype. Outputs are torch tensors
    when q is one, else numpy arrays. ``kernel``: "auto" | "reference" | "optimized".
    """
    args = _common(q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                   kernel)
    pool = state_indices is not None
    if pool:
        args.update(initial_state=None, output_final_state=True,
                    state=None if initial_state is None else for_core_writable(initial_state, "initial_state"),
                    state_indices=int_array(state_indices, "state_indices", np.int32))
    else:
        args.update(initial_state=None if initial_state is None else for_core(initial_state, "initial_state"),
                    output_final_state=bool(output_final_state), state=None, state_indices=None)
    s = _core.chunk_kda(o=None, final_state=None, check_only=True, **args)
    o = _output(q, s)
    final = None
    if output_final_state and not pool:
        final = empty_like_framework(q, (s["N"], s["H"], s["K"], s["V"]), np.dtype(np.float32))
    _core.chunk_kda(o=for_core(o, "o"), final_state=None if final is None else for_core(final, "final_state"),
                    **args)
    if pool:
        return o, (initial_state if output_final_state else None)
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
    args = _common(q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                   kernel)
    idx = None if ssm_state_indices is None else int_array(ssm_state_indices, "ssm_state_indices", np.int32)
    # The pool as the core will see it for the check: the array itself, or its shape when it is only read.
    pool = None
    if initial_state is not None:
        pool = for_core_writable(initial_state, "initial_state") if inplace_final_state else spec_of(initial_state,
                                                                                                     "initial_state")
    s = _core.fused_recurrent_kda(o=None, initial_state=pool, ssm_state_indices=idx, check_only=True, **args)
    N, H, K, V = s["N"], s["H"], s["K"], s["V"]
    if idx is None:
        idx = np.arange(N, dtype=np.int32)
        if pool is not None:  # sequence n uses state n: the pool must hold them
            _core.fused_recurrent_kda(o=None, initial_state=pool, ssm_state_indices=idx, check_only=True, **args)
    if initial_state is None:
        state = empty_like_framework(q, (N, H, K, V), np.dtype(np.float32), zero=True)
    elif inplace_final_state:
        state = initial_state
    else:
        # A new [N, H, K, V]: sequence n's state gathered from the pool, updated there.
        valid = np.nonzero(idx >= 0)[0]
        state = empty_like_framework(q, (N, H, K, V), np.dtype(np.float32), zero=True)
        if is_torch(state):
            import torch

            src = initial_state if is_torch(initial_state) else torch.from_numpy(np.asarray(initial_state))
            state[torch.from_numpy(valid)] = src.detach()[torch.from_numpy(idx[valid].astype(np.int64))].float()
        else:
            state[valid] = np.asarray(initial_state)[idx[valid]]
        idx = np.where(idx >= 0, np.arange(N, dtype=np.int32), -1).astype(np.int32)
    o = _output(q, s)
    _core.fused_recurrent_kda(o=for_core(o, "o"), initial_state=for_core_writable(state, "initial_state"),
                              ssm_state_indices=idx, **args)
    return o, state
