"""Pure-JAX KDA and Gated DeltaNet kernels: the token-by-token recurrence of design §2.5 in fp32, every
option of fla's API.

Per value head, with the state S (K x V, indexed [k][v]) and each token t:

    S <- diag(exp(g_t)) S                          (g_t in R^K: KDA; a scalar per value head: GDN)
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T      (beta_t a scalar, or a [V] vector)
                                                   (Mamba2's SSD, no delta correction: S + k_t (beta_t v_t)^T)
    o_t = S^T (scale * q_t)

These are the reference the FFI kernels are checked against and the fallback when the FFI library
cannot load. They run anywhere JAX runs (CPU, GPU, TPU) and under ``jax.jit``: one ``lax.scan`` over
the packed tokens that loads a sequence's state at its first token and stores states where the call's
state form says, so ``cu_seqlens`` and the indices may be traced. :func:`run` takes a call checked by
kda.jax._args (the entries are kda.jax's). Traced index values are checked when the call runs, before
the recurrence (:func:`checked_values`): a bad one fails the call rather than reading zeros or writing
nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import io_callback

from . import _args

_HIGHEST = lax.Precision.HIGHEST  # fp32 products on every platform (no TF32)


def l2_normalize(x):
    """x / sqrt(sum x^2 + 1e-6) over the last axis (fp32)."""
    return x * lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def kda_gate(g_raw, A_log=None, dt_bias=None, lower_bound=None):
    """The forget gate of raw g [..., HV, K] (fp32; [..., HV, 1] a scalar gate per value head), x = g_raw +
    dt_bias ([HV * K], [HV] for the scalar gate, or None): -exp(A_log) * softplus(x) (softplus(x) = x above
    20), or with ``lower_bound`` lower_bound * sigmoid(exp(A_log) * x) (A_log None: lower_bound * sigmoid(x))."""
    HV, K = g_raw.shape[-2:]
    x = g_raw if dt_bias is None else g_raw + dt_bias.reshape(HV, K)
    if lower_bound is not None:
        a = 1.0 if A_log is None else jnp.exp(A_log)[:, None]
        return lower_bound * jax.nn.sigmoid(a * x)
    softplus = jnp.where(x > 20.0, x, jnp.log1p(jnp.exp(jnp.minimum(x, 20.0))))
    return -jnp.exp(A_log)[:, None] * softplus


def gdn_gate(g_raw, A_log, dt_bias=None):
    """Gated DeltaNet's forget gate of raw g [..., HV] (fp32), dt_bias [HV] or None:
    -exp(A_log) * softplus(g_raw + dt_bias) (softplus(x) = x above 20)."""
    return kda_gate(g_raw[..., None], A_log, dt_bias)[..., 0]


def _prepare(c: _args.Call):
    """Token operands as fp32 [tokens, HV, *] with the l2 norm, grouped heads, scale, gate and beta
    activation applied; g [tokens, HV, K] or, a scalar gate, [tokens, HV, 1]; beta [tokens, HV, 1] or
    [tokens, HV, V]."""
    st = c.st
    f32 = jnp.float32
    q = c.q.astype(f32).reshape(-1, st.H, st.K)
    k = c.k.astype(f32).reshape(-1, st.H, st.K)
    v = c.v.astype(f32).reshape(-1, st.HV, st.V)
    g = c.g.astype(f32).reshape(-1, st.HV, st.gate_width)
    beta = c.beta.astype(f32).reshape(q.shape[0], st.HV, -1)
    if st.use_qk_l2norm_in_kernel:
        q = l2_normalize(q)
        k = l2_normalize(k)
    if st.HV != st.H:  # value head i uses key head i / m
        q = jnp.repeat(q, st.HV // st.H, axis=1)
        k = jnp.repeat(k, st.HV // st.H, axis=1)
    if st.use_gate_in_kernel:
        g = kda_gate(g, c.A_log, c.dt_bias, st.lower_bound)
    if st.use_beta_sigmoid_in_kernel:
        beta = jax.nn.sigmoid(beta) * (2.0 if st.allow_neg_eigval else 1.0)
    return q * st.scale_value, k, v, g, beta


def _step(S, q, k, v, g, beta, delta_correction=True):
    """One token of every value head: S [HV, K, V]; q, k [HV, K]; g [HV, K] or [HV, 1]; v [HV, V]; beta
    [HV, 1] or [HV, V]. Without ``delta_correction`` (Mamba2's SSD) S += k (beta v)^T."""
    S = S * jnp.exp(g)[..., None]
    if delta_correction:
        v = v - jnp.einsum("hk,hkv->hv", k, S, precision=_HIGHEST)
    S = S + k[..., :, None] * (beta * v)[..., None, :]
    return S, jnp.einsum("hk,hkv->hv", q, S, precision=_HIGHEST)


def checked_values(c: _args.Call):
    """0, after the check of the call's traced index values (its ``value_check``, the core's check of the
    values) in a host callback when the call runs: a bad value raises there and fails the call (a
    JaxRuntimeError carrying the core's ValueError). Its result, an int32 zero, is added to the sequence
    boundaries, on which every result of the recurrence depends: the check runs first and is not dropped."""
    check = c.st.value_check
    if check is None:  # concrete values: checked when the call was traced
        return 0
    values = (getattr(c, f) for f, _ in check.fields)
    return io_callback(check, jax.ShapeDtypeStruct((), jnp.int32), *values)


def run(c: _args.Call):
    """A checked call: chunk_kda's (o, final state or pool or None[, intermediate states]) or
    fused_recurrent_kda_fwd's (o, updated initial_state or new states or None)."""
    st = c.st
    q, k, v, g, beta = _prepare(c)
    N, HV, K, V = st.N, st.HV, st.K, st.V
    f32 = jnp.float32
    n_tok = q.shape[0]

    def kv(x):  # a state batch between the call's layout and [.., K, V]
        return jnp.swapaxes(x, -1, -2) if st.state_v_first and x is not None else x

    cu = c.cu_seqlens if c.cu_seqlens is not None else jnp.arange(N + 1, dtype=jnp.int32) * st.T
    cu = cu + checked_values(c)
    t = jnp.arange(n_tok, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(cu[1:], t, side="right").astype(jnp.int32), N - 1)  # cu[n] <= t < cu[n+1]
    pos = t - cu[seq]
    end = t == cu[seq + 1] - 1
    pool = c.indices is not None
    state = kv(c.state)
    if pool:
        idx = c.indices
        if idx.ndim == 2:  # the state before token 0 is in slot [n, a - 1]
            accepted = c.num_accepted_tokens if c.num_accepted_tokens is not None else jnp.ones(N, jnp.int32)
            read = jnp.take_along_axis(idx, (accepted - 1)[:, None], axis=1)[:, 0]
        else:
            read = idx
        states = state.astype(f32)  # a float16 / bfloat16 pool: fp32 math, written back rounded
    else:
        read = jnp.arange(N, dtype=jnp.int32)
        states = state.astype(f32) if state is not None else jnp.zeros((N, HV, K, V), f32)
    valid = (read >= 0)[seq]  # a negative read slot: padding
    none = states.shape[0]  # an index past the states: reads zeros, writes nothing
    read_t = jnp.where((pos == 0) & valid, read[seq], none)
    per_token = st.kind == "recurrent" and pool and not st.inplace_final_state
    if per_token:  # the pool is only read; the state after every token is a result
        write_t = jnp.full_like(t, none)
    elif st.kind == "recurrent" and pool and c.indices.ndim == 2 and c.indices.shape[1] > 1:
        # A slot per token: the state after token t to slot [n, t] ([N, 1] is one slot per sequence, as [N] is).
        cols = c.indices.shape[1]
        w = c.indices[seq, jnp.minimum(pos, cols - 1)]
        write_t = jnp.where(valid & (pos < cols) & (w >= 0), w, none)
    else:  # the state after the last token to the slot read
        write_t = jnp.where(end & valid, read[seq], none)
    if st.return_intermediate_states:  # chunk j of a sequence: the state before its first token
        lens = cu[1:] - cu[:-1]
        first_chunk = jnp.cumsum((lens + st.chunk_size - 1) // st.chunk_size) - (lens + st.chunk_size - 1) // st.chunk_size
        h_t = jnp.where(pos % st.chunk_size == 0, first_chunk[seq] + pos // st.chunk_size, st.B * st.num_chunks)
        h = jnp.zeros((st.B * st.num_chunks, HV, K, V), f32)
    else:
        h_t = jnp.zeros_like(t)
        h = None

    def body(carry, x):
        S, states, h = carry
        q_t, k_t, v_t, g_t, b_t, r_t, w_t, h_i, valid_t = x
        S = jnp.where(r_t != none, states.at[r_t].get(mode="fill", fill_value=0.0), S)
        S = jnp.where(valid_t, S, 0.0)
        if h is not None:
            h = h.at[h_i].set(S, mode="drop")
        S, o_t = _step(S, q_t, k_t, v_t, g_t, b_t, st.delta_correction)
        states = states.at[w_t].set(S, mode="drop")
        return (S, states, h), (jnp.where(valid_t, o_t, 0.0), S if per_token else None)

    S0 = jnp.zeros((HV, K, V), f32)
    (_, states, h), (o, token_states) = lax.scan(body, (S0, states, h),
                                                 (q, k, v, g, beta, read_t, write_t, h_t, valid))
    o = o.reshape(st.B, st.T, HV, V).astype(c.q.dtype if st.kind == "chunk" else c.v.dtype)  # fla's dtypes
    if c.out is not None:  # o written into out's buffer (donated by the entry)
        o = lax.dynamic_update_slice(c.out, o, (0, 0, 0, 0))
    if st.kind == "chunk":
        final = kv(states) if pool or st.output_final_state else None
        if not st.return_intermediate_states:
            return o, final
        h = kv(h).reshape(st.B, st.num_chunks, HV, *st.state_dims).astype(c.k.dtype)
        return o, final, h
    if st.inplace_final_state:
        return o, kv(states).astype(c.state.dtype)
    if not st.output_final_state:
        return o, None
    if per_token:
        return o, kv(jnp.where(valid[:, None, None, None], token_states, 0.0))
    return o, kv(states)


__all__ = ["checked_values", "gdn_gate", "kda_gate", "l2_normalize", "run"]
