"""The KDA kernels as PyTorch custom operators: ``import kda.torch`` registers

- ``torch.ops.kda.chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
  use_qk_l2norm_in_kernel, use_gate_in_kernel, cu_seqlens, A_log, dt_bias, state_indices, kernel)
  -> (o, final_state)``: with ``state_indices`` the pool ``initial_state`` [S, H, K, V] is updated in
  place (declared mutated) and ``final_state`` is empty ([0]); otherwise ``final_state`` is a new
  [N, H, K, V] when ``output_final_state`` (else empty).
- ``torch.ops.kda.fused_recurrent_kda(q, k, v, g, beta, scale, initial_state, cu_seqlens,
  ssm_state_indices, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, kernel) -> o``: the
  state pool ``initial_state`` updated in place (declared mutated).

They are ``torch.library.custom_op``s over kda's C++ kernels (CPU tensors, read and written in place
through DLPack; no build against torch's headers), with fake implementations so ``torch.compile``
traces them. :func:`chunk_kda` and :func:`fused_recurrent_kda` here wrap them with fla's signatures
and return values (the pool itself as the final state, ``inplace_final_state``).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _kernels

__all__ = ["chunk_kda", "fused_recurrent_kda"]


@torch.library.custom_op("kda::chunk_kda", mutates_args=("initial_state",), device_types="cpu")
def _chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               scale: Optional[float], initial_state: Optional[torch.Tensor], output_final_state: bool,
               use_qk_l2norm_in_kernel: bool, use_gate_in_kernel: bool, cu_seqlens: Optional[torch.Tensor],
               A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
               state_indices: Optional[torch.Tensor], kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    o, final = _kernels.chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=output_final_state,
                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                  use_gate_in_kernel=use_gate_in_kernel, cu_seqlens=cu_seqlens, A_log=A_log,
                                  dt_bias=dt_bias, state_indices=state_indices, kernel=kernel)
    if state_indices is not None or final is None:
        final = q.new_empty((0,), dtype=torch.float32)  # outputs may not alias the pool
    return o, final


@_chunk_kda.register_fake
def _(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
      cu_seqlens, A_log, dt_bias, state_indices, kernel):
    B, T, H, K = q.shape
    V = v.shape[3]
    o = q.new_empty((B, T, H, V))
    if state_indices is None and output_final_state:
        N = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
        return o, q.new_empty((N, H, K, V), dtype=torch.float32)
    return o, q.new_empty((0,), dtype=torch.float32)


@torch.library.custom_op("kda::fused_recurrent_kda", mutates_args=("initial_state",), device_types="cpu")
def _fused_recurrent_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         scale: Optional[float], initial_state: torch.Tensor, cu_seqlens: Optional[torch.Tensor],
                         ssm_state_indices: Optional[torch.Tensor], use_qk_l2norm_in_kernel: bool,
                         use_gate_in_kernel: bool, A_log: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor],
                         kernel: str) -> torch.Tensor:
    o, _ = _kernels.fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                        inplace_final_state=True, cu_seqlens=cu_seqlens,
                                        ssm_state_indices=ssm_state_indices,
                                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                        use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias,
                                        kernel=kernel)
    return o


@_fused_recurrent_kda.register_fake
def _(q, k, v, g, beta, scale, initial_state, cu_seqlens, ssm_state_indices, use_qk_l2norm_in_kernel,
      use_gate_in_kernel, A_log, dt_bias, kernel):
    B, T, H, _ = q.shape
    return q.new_empty((B, T, H, v.shape[3]))


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, cu_seqlens=None, A_log=None, dt_bias=None,
              state_indices=None, *, kernel="auto"):
    """fla's ``chunk_kda`` through ``torch.ops.kda.chunk_kda`` (see kda.chunk_kda): returns
    ``(o, final_state or None)``, the pool itself as the final state with ``state_indices``."""
    o, final = torch.ops.kda.chunk_kda(q, k, v, g, beta, None if scale is None else float(scale), initial_state,
                                       bool(output_final_state), bool(use_qk_l2norm_in_kernel),
                                       bool(use_gate_in_kernel), cu_seqlens, A_log, dt_bias, state_indices, kernel)
    if not output_final_state:
        return o, None
    return o, (initial_state if state_indices is not None else final)


def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True, cu_seqlens=None,
                        ssm_state_indices=None, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None,
                        dt_bias=None, *, kernel="auto"):
    """vLLM's ``fused_recurrent_kda`` through ``torch.ops.kda.fused_recurrent_kda`` (see
    kda.fused_recurrent_kda): returns ``(o, final_state)``."""
    B, T, H, K = q.shape
    V = v.shape[3]
    N = B * T
    if initial_state is None:
        if ssm_state_indices is not None:
            raise ValueError("initial_state: ssm_state_indices needs the state pool initial_state [S, H, K, V]")
        state = q.new_zeros((N, H, K, V), dtype=torch.float32)
    elif inplace_final_state:
        state = initial_state
    else:
        # A new [N, H, K, V]: each sequence's state gathered from the pool (zeros for padding).
        idx = (torch.arange(N) if ssm_state_indices is None else torch.as_tensor(ssm_state_indices)).reshape(-1)
        idx = idx.to(torch.int64)
        if idx.shape[0] != N:
            raise ValueError(f"ssm_state_indices: expected shape [N] = [{N}], got {list(idx.shape)}")
        S = initial_state.shape[0]
        if bool((idx >= S).any()):
            raise ValueError(f"ssm_state_indices: an index is out of range for num_states = {S}")
        valid = idx >= 0
        state = q.new_zeros((N, H, K, V), dtype=torch.float32)
        state[valid] = initial_state[idx[valid]].to(torch.float32)
        ssm_state_indices = torch.where(valid, torch.arange(N), -1).to(torch.int32)
    o = torch.ops.kda.fused_recurrent_kda(q, k, v, g, beta, None if scale is None else float(scale), state,
                                          cu_seqlens, ssm_state_indices, bool(use_qk_l2norm_in_kernel),
                                          bool(use_gate_in_kernel), A_log, dt_bias, kernel)
    return o, state
