"""Pure-JAX KDA kernels: the token-by-token recurrence of design §2.5 in fp32.

Per head, with the state S (K x V, indexed [k][v]) and each token t:

    S <- diag(exp(g_t)) S
    S <- S + beta_t k_t (v_t - S^T k_t)^T
    o_t = S^T (scale * q_t)

These are the reference the FFI kernels are checked against and the fallback
when the FFI library cannot load. They run anywhere JAX runs (CPU, GPU, TPU)
and under ``jax.jit``; packed variable-length batches are one ``lax.scan`` over
the tokens that reloads the state at each sequence start, so ``cu_seqlens``
may be traced.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from . import _args


def l2_normalize(x):
    """x / sqrt(sum x^2 + 1e-6) over the last axis (fp32)."""
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def kda_gate(g_raw, A_log, dt_bias=None):
    """The forget gate: g = -exp(A_log[h]) * softplus(g_raw + dt_bias[h*K + d]), softplus(x) = x for x > 20.

    g_raw [..., H, K] fp32, A_log [H], dt_bias [H*K] or None.
    """
    H, K = g_raw.shape[-2:]
    x = g_raw if dt_bias is None else g_raw + dt_bias.reshape(H, K)
    softplus = jnp.where(x > 20.0, x, jnp.log1p(jnp.exp(jnp.minimum(x, 20.0))))
    return -jnp.exp(A_log)[:, None] * softplus


def _prepare(spec: _args.Spec):
    """Token operands as fp32 [tokens, H, *] with l2 norm, scale and gate applied."""
    f32 = jnp.float32
    H, K, V = spec.H, spec.K, spec.V
    q = spec.q.astype(f32).reshape(-1, H, K)
    k = spec.k.astype(f32).reshape(-1, H, K)
    v = spec.v.astype(f32).reshape(-1, H, V)
    g = spec.g.astype(f32).reshape(-1, H, K)
    beta = spec.beta.astype(f32).reshape(-1, H)
    if spec.use_qk_l2norm_in_kernel:
        q = l2_normalize(q)
        k = l2_normalize(k)
    if spec.use_gate_in_kernel:
        g = kda_gate(g, spec.A_log, spec.dt_bias)
    return q * spec.scale, k, v, g, beta


def _step(S, q, k, v, g, beta):
    """One token for every head: S [..., H, K, V]; q, k, g [..., H, K]; v [..., H, V]; beta [..., H]."""
    S = S * jnp.exp(g)[..., None]
    kS = jnp.einsum("...hk,...hkv->...hv", k, S)
    u = beta[..., None] * (v - kS)
    S = S + k[..., :, None] * u[..., None, :]
    o = jnp.einsum("...hk,...hkv->...hv", q, S)
    return S, o


def _chunk(spec: _args.Spec, output_final_state: bool):
    q, k, v, g, beta = _prepare(spec)
    N, H, K, V = spec.N, spec.H, spec.K, spec.V
    n_tok = q.shape[0]
    pool = spec.state_indices is not None
    if spec.cu_seqlens is None:
        cu = jnp.arange(N + 1, dtype=jnp.int32) * spec.T
    else:
        cu = spec.cu_seqlens
    if pool:
        states = spec.state
        slots = spec.state_indices  # < 0: padding
    else:
        states = spec.state if spec.state is not None else jnp.zeros((N, H, K, V), jnp.float32)
        slots = jnp.arange(N, dtype=jnp.int32)
    t = jnp.arange(n_tok, dtype=jnp.int32)
    seq = jnp.searchsorted(cu[1:], t, side="right").astype(jnp.int32)  # cu[seq] <= t < cu[seq + 1]
    seq = jnp.minimum(seq, N - 1)
    start = t == cu[seq]
    end = t == cu[seq + 1] - 1
    slot = slots[seq]
    valid = slot >= 0
    slot = jnp.where(valid, slot, 0)

    def body(carry, x):
        S, states = carry
        q_t, k_t, v_t, g_t, b_t, start_t, end_t, slot_t, valid_t = x
        # A sequence starts from its own state (zeros for padding).
        S = jnp.where(start_t, jnp.where(valid_t, states[slot_t], 0.0), S)
        S, o_t = _step(S, q_t, k_t, v_t, g_t, b_t)
        o_t = jnp.where(valid_t, o_t, 0.0)
        keep = states[slot_t]
        states = states.at[slot_t].set(jnp.where(end_t & valid_t, S, keep))
        return (S, states), o_t

    S0 = jnp.zeros((H, K, V), jnp.float32)
    (_, states), o = lax.scan(body, (S0, states), (q, k, v, g, beta, start, end, slot, valid))
    o = o.reshape(spec.q.shape[:3] + (V,)).astype(spec.q.dtype)
    if pool:
        return o, states
    return o, (states if output_final_state else None)


def _recurrent(spec: _args.Spec):
    q, k, v, g, beta = _prepare(spec)  # [N, H, *]
    N, H, K, V = spec.N, spec.H, spec.K, spec.V
    pool = spec.state if spec.state is not None else jnp.zeros((N, H, K, V), jnp.float32)
    idx = spec.state_indices if spec.state_indices is not None else jnp.arange(N, dtype=jnp.int32)
    S_count = pool.shape[0]
    valid = idx >= 0
    # Padding entries read zeros and write nothing (an index past the pool is dropped).
    at = jnp.where(valid, idx, S_count)
    S = pool.at[at].get(mode="fill", fill_value=0.0)
    S, o = _step(S, q, k, v, g, beta)
    pool = pool.at[at].set(S, mode="drop")
    o = jnp.where(valid[:, None, None], o, 0.0)
    return o.reshape(spec.q.shape[:3] + (V,)).astype(spec.q.dtype), pool


def chunk_kda_jax_naive(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, cu_seqlens=None, A_log=None,
                        dt_bias=None, state_indices=None):
    """Prefill over a batch, pure JAX; the arguments and results of :func:`kda.jax.chunk_kda`.

    Returns (o, final_state or None). With ``state_indices`` the second result is the updated pool.
    Any head shape works here (the FFI kernels need K == V, a multiple of 16 in [16, 256]).
    """
    spec = _args.check_chunk(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                             cu_seqlens, A_log, dt_bias, state_indices, who="chunk_kda_jax_naive")
    return _chunk(spec, bool(output_final_state))


def fused_recurrent_kda_jax_naive(q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True,
                                  cu_seqlens=None, ssm_state_indices=None, use_qk_l2norm_in_kernel=False,
                                  use_gate_in_kernel=False, A_log=None, dt_bias=None):
    """Decode (one token per sequence), pure JAX; the arguments and results of
    :func:`kda.jax.fused_recurrent_kda`. Returns (o, the updated state pool)."""
    del inplace_final_state  # a functional update either way; donation is the dispatcher's
    spec = _args.check_recurrent(q, k, v, g, beta, scale, initial_state, cu_seqlens, ssm_state_indices,
                                 use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                                 who="fused_recurrent_kda_jax_naive")
    return _recurrent(spec)


__all__ = ["chunk_kda_jax_naive", "fused_recurrent_kda_jax_naive", "kda_gate", "l2_normalize"]
