"""kda.jax's Gated DeltaNet entries (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule,
fused_recurrent_gated_delta_rule_fwd, fused_gdn_gate): the XLA FFI kernels and the pure-JAX naive kernels,
eager and under jax.jit, against the float64 recurrence of ../shared/tools/gdn_ref.py (grouped value heads
1-4, K != V, gates down to -60, state pools with padding, 2-D slots with accepted counts, fp32 and
bf16 / fp16 operands); pools donated and updated in place; bad arguments refused by name.

Tolerances are design §5's fp32 rule (golden.py); half-precision outputs add one rounding of o. Without
the FFI library the FFI tests skip (KDA_REQUIRE_XLA_FFI=1 makes them fail); without ../shared/tools the
reference tests skip (KDA_REQUIRE_GOLDEN=1 makes them fail).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kda.jax as kj

from golden import check_f32, gdn_ref, ulp_bf16  # noqa: F401 (gdn_ref: a fixture)
from jax_util import BACKENDS, backend, ffi_or_skip  # noqa: F401 (backend: a fixture)
from golden import check_state_f32 as check_state

# --- problems and the reference ---------------------------------------------------------------------------


def _problem(seed, B, T, H, HV, K, V, gate_min=-60.0):
    """fp32 q, k [B, T, H, K], v [B, T, HV, V], g [B, T, HV] (log-uniform in [gate_min, -1e-3], the
    extremes included) and beta [B, T, HV] in (0, 1)."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((B, T, HV, V)).astype(np.float32)
    g = -np.exp(rng.uniform(np.log(1e-3), np.log(-gate_min), (B, T, HV))).astype(np.float32)
    g.reshape(-1)[:2] = (gate_min, -1e-3)
    beta = rng.uniform(0.05, 1.0, (B, T, HV)).astype(np.float32)
    return [q, k, v, g, beta], rng


def _reference(ref, q, k, v, g, beta, states, cu, state_v_first=False):
    """gdn_ref.recurrent sequence by sequence over the packed tokens (cu [N + 1]; rows of [B, T] flattened),
    from ``states`` [N, HV, K, V] (None: zeros; V-first with ``state_v_first``): (o like v, final states)."""
    f = lambda x: np.asarray(x, np.float64).reshape((-1,) + np.shape(x)[2:])  # noqa: E731
    q, k, v, g, beta = (f(x) for x in (q, k, v, g, beta))
    N, HV, K, V = len(cu) - 1, v.shape[1], q.shape[2], v.shape[2]
    if states is None:
        states = np.zeros((N, HV, K, V))
    states = np.asarray(states, np.float64)
    if state_v_first:
        states = np.swapaxes(states, -1, -2)
    o, final = np.zeros_like(v), np.zeros((N, HV, K, V))
    for n in range(N):
        a, b = int(cu[n]), int(cu[n + 1])
        o[a:b], final[n] = ref.recurrent(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], states[n])
    return o, (np.swapaxes(final, -1, -2) if state_v_first else final)


def _rows(B, T):
    return np.arange(B + 1) * T


def _softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _check_half(a, r, dtype, what):
    """A bf16 / fp16 o against the exact one: the fp32 rule plus one rounding step of o's dtype."""
    a, r = np.asarray(a, np.float64), np.asarray(r, np.float64)
    m = np.maximum(np.abs(a), np.abs(r))
    ulp = np.spacing(m.astype(np.float16)).astype(np.float64) if dtype == jnp.float16 else ulp_bf16(m)
    tol = 1e-5 + 1e-5 * np.abs(r) + ulp
    assert (np.abs(a - r) <= tol).all(), f"{what}: max err/tol {np.max(np.abs(a - r) / tol)}"


# --- chunk_gated_delta_rule ----------------------------------------------------------------------------------

# (H, HV, K, V, chunk_size, state_v_first, eager too): grouped value heads 1-4, K != V, every chunk size fla
# takes.
GVA = [(2, 2, 16, 16, 16, False, True), (2, 4, 12, 20, 32, True, True), (1, 3, 32, 8, 64, False, False),
       (2, 8, 8, 24, 16, False, False)]


@pytest.mark.parametrize("H,HV,K,V,chunk_size,state_v_first,eager", GVA)
def test_chunk_against_reference(H, HV, K, V, chunk_size, state_v_first, eager, backend, gdn_ref):
    """Packed sequences (an empty one among them) from initial states, under jax.jit (cu_seqlens traced), and
    eagerly: the float64 recurrence's o and final states within the fp32 rule."""
    lens = [9, 0, 21, 17]
    T = sum(lens)
    arrays, rng = _problem(100 + HV, 1, T, H, HV, K, V)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    dims = (V, K) if state_v_first else (K, V)
    init = rng.standard_normal((len(lens), HV, *dims)).astype(np.float32)
    want_o, want_s = _reference(gdn_ref, *arrays, init, cu, state_v_first)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, chunk_size=chunk_size,
              state_v_first=state_v_first, kernel=backend)
    run = jax.jit(lambda q, k, v, g, b, s, cu: kj.chunk_gated_delta_rule(q, k, v, g, b, initial_state=s,
                                                                          cu_seqlens=cu, **kw))
    xs = [jnp.asarray(x) for x in (*arrays, init, cu)]
    results = [("jit", run(*xs))]
    if eager:
        results.append(("eager", kj.chunk_gated_delta_rule(*xs[:5], initial_state=xs[5], cu_seqlens=xs[6], **kw)))
    for how, (o, s) in results:
        assert o.shape == (1, T, HV, V) and o.dtype == jnp.float32 and s.shape == (len(lens), HV, *dims)
        check_f32(o[0], want_o, what=f"{backend} {how} o")
        check_state(s, want_s, what=f"{backend} {how} final state")


def test_chunk_batched_rows_options(backend, gdn_ref):
    """B rows without cu_seqlens; the gate in the kernel (A_log, dt_bias [HV]), beta logits with
    allow_neg_eigval (beta in (0, 2)), a custom scale (o is linear in it), zeros as the initial state."""
    B, T, H, HV, K, V = 2, 19, 2, 4, 16, 12
    (q, k, v, _, beta_logits), rng = _problem(7, B, T, H, HV, K, V)
    g_raw = (rng.standard_normal((B, T, HV)) * 12).astype(np.float32)  # both softplus branches
    a_log, dt_bias = rng.uniform(-1, 2, HV).astype(np.float32), rng.standard_normal(HV).astype(np.float32)
    g = -np.exp(a_log.astype(np.float64)) * _softplus(g_raw + dt_bias.astype(np.float64))
    beta = 2.0 / (1.0 + np.exp(-beta_logits.astype(np.float64)))
    want_o, want_s = _reference(gdn_ref, q, k, v, g, beta, None, _rows(B, T))
    scale = 0.3
    run = jax.jit(functools.partial(kj.chunk_gated_delta_rule, scale=scale, output_final_state=True,
                                    use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                    allow_neg_eigval=True, use_gate_in_kernel=True, kernel=backend))
    o, s = run(*(jnp.asarray(x) for x in (q, k, v, g_raw, beta_logits)), A_log=jnp.asarray(a_log),
               dt_bias=jnp.asarray(dt_bias))
    check_f32(o, want_o.reshape(o.shape) * scale * K**0.5, what=f"{backend} o")
    check_state(s, want_s, what=f"{backend} final state")


def test_chunk_pool_form_donated(backend, gdn_ref):
    """kda's pool form (state_indices, a padding sequence): the pool donated by the eager call and updated in
    place, slots nobody uses bit-identical, the padding sequence's outputs zeros."""
    lens, H, HV, K, V = [6, 11, 4], 1, 2, 8, 12
    arrays, rng = _problem(11, 1, sum(lens), H, HV, K, V)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    pool = rng.standard_normal((5, HV, K, V)).astype(np.float32)
    idx = np.array([3, -1, 0], np.int32)
    want_o, want_s = _reference(gdn_ref, *arrays, pool[[3, 0, 0]], cu)
    p = jnp.asarray(pool)
    ptr = p.unsafe_buffer_pointer()
    o, new = kj.chunk_gated_delta_rule(*(jnp.asarray(x) for x in arrays), initial_state=p, cu_seqlens=jnp.asarray(cu),
                                       use_qk_l2norm_in_kernel=True, state_indices=jnp.asarray(idx), kernel=backend)
    assert p.is_deleted() and new.unsafe_buffer_pointer() == ptr
    o, new = np.asarray(o[0]), np.asarray(new)
    assert not o[6:17].any()
    check_f32(o[:6], want_o[:6], what="sequence 0")
    check_f32(o[17:], want_o[17:], what="sequence 2")
    check_state(new[3], want_s[0], what="slot 3")
    check_state(new[0], want_s[2], what="slot 0")
    for slot in (1, 2, 4):
        np.testing.assert_array_equal(new[slot], pool[slot])


# --- fused_recurrent_gated_delta_rule (fla's public entry) -----------------------------------------------------


def test_recurrent_against_reference(backend, gdn_ref):
    """fla's public entry under jax.jit and eagerly: B rows and packed sequences, GVA 3, K != V, the raw
    gate in the kernel, V-first states."""
    B, T, H, HV, K, V = 3, 5, 1, 3, 20, 12
    (q, k, v, g, beta), rng = _problem(21, B, T, H, HV, K, V)
    init = rng.standard_normal((B, HV, K, V)).astype(np.float32)
    want_o, want_s = _reference(gdn_ref, q, k, v, g, beta, init, _rows(B, T))
    run = jax.jit(lambda q, k, v, g, b, s: kj.fused_recurrent_gated_delta_rule(
        q, k, v, g, beta=b, initial_state=s, output_final_state=True, use_qk_l2norm_in_kernel=True, kernel=backend))
    xs = [jnp.asarray(x) for x in (q, k, v, g, beta, init)]
    for how, (o, s) in (("jit", run(*xs)), ("eager", kj.fused_recurrent_gated_delta_rule(
            *xs[:4], beta=xs[4], initial_state=xs[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
            kernel=backend))):
        check_f32(o, want_o.reshape(o.shape), what=f"{backend} {how} o")
        check_state(s, want_s, what=f"{backend} {how} final state")
    # Packed, the gate in the kernel, V-first states; initial_state is only read.
    cu = np.array([0, 4, 5, 15], np.int32)
    g_raw = (rng.standard_normal((1, 15, HV)) * 3).astype(np.float32)
    a_log, dt_bias = rng.standard_normal(HV).astype(np.float32), rng.standard_normal(HV).astype(np.float32)
    g_act = -np.exp(a_log.astype(np.float64)) * _softplus(g_raw + dt_bias.astype(np.float64))
    flat = [x.reshape((1, 15) + x.shape[2:]) for x in (q, k, v, beta)]
    init_vf = np.swapaxes(init, -1, -2).copy()
    want_o, want_s = _reference(gdn_ref, flat[0], flat[1], flat[2], g_act, flat[3], init_vf, cu, state_v_first=True)
    s_in = jnp.asarray(init_vf)
    o, s = kj.fused_recurrent_gated_delta_rule(
        *(jnp.asarray(x) for x in flat[:3]), jnp.asarray(g_raw), beta=jnp.asarray(flat[3]), initial_state=s_in,
        output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=a_log,
        dt_bias=dt_bias, state_v_first=True, cu_seqlens=jnp.asarray(cu), kernel=backend)
    assert not s_in.is_deleted()
    check_f32(o[0], want_o, what=f"{backend} packed o")
    check_state(s, want_s, what=f"{backend} packed final state")


def test_recurrent_decays_and_default_beta(backend, gdn_ref):
    """fla's decays: none (no decay) with beta None (ones); gk [B, T, HV, K] (KDA's recurrence: the KDA
    entry's result); g and gk together (their sum); gv refused."""
    B, T, H, HV, K, V = 2, 4, 2, 4, 8, 16
    (q, k, v, g, _), rng = _problem(31, B, T, H, HV, K, V)
    q, k, v, g = (jnp.asarray(x) for x in (q, k, v, g))
    o, s = kj.fused_recurrent_gated_delta_rule(q, k, v, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                               kernel=backend)
    want_o, want_s = _reference(gdn_ref, q, k, v, np.zeros((B, T, HV)), np.ones((B, T, HV)), None, _rows(B, T))
    check_f32(o, want_o.reshape(o.shape), what="no decay, beta ones: o")
    check_state(s, want_s, what="no decay, beta ones: state")
    gk = jnp.asarray(-np.exp(rng.standard_normal((B, T, HV, K)) - 1).astype(np.float32))
    beta = jnp.asarray(rng.uniform(0, 1, (B, T, HV)).astype(np.float32))
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True, kernel=backend)
    got = kj.fused_recurrent_gated_delta_rule(q, k, v, gk=gk, beta=beta, **kw)
    want = kj.fused_recurrent_kda(q, k, v, gk, beta, **kw)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    got = jax.jit(lambda g, gk: kj.fused_recurrent_gated_delta_rule(q, k, v, g, gk, beta=beta, **kw))(g, gk)
    want = kj.fused_recurrent_kda(q, k, v, gk + g[..., None], beta, **kw)
    check_f32(got[0], want[0], what="g and gk: o")
    check_state(got[1], want[1], what="g and gk: state")
    with pytest.raises(NotImplementedError, match="fused_recurrent_gated_delta_rule: gv"):
        kj.fused_recurrent_gated_delta_rule(q, k, v, g, gv=v, beta=beta, kernel=backend)


# --- fused_recurrent_gated_delta_rule_fwd (vLLM's pool and speculative-decoding entry) ------------------------


def test_fwd_decode_pool_with_padding_under_jit(backend, gdn_ref):
    """Decode steps in one jitted lax.scan that carries the pool: sequences of different lengths as rows of
    one token, finished ones padding (negative slot, zero outputs, slot untouched); then one step under a
    jax.jit that donates the pool, updated in place."""
    lens, H, HV, K, V = [5, 2, 4], 2, 6, 16, 8
    arrays, rng = _problem(41, 1, sum(lens), H, HV, K, V)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    pool = rng.standard_normal((6, HV, K, V)).astype(np.float32)
    slots = np.array([4, 0, 2], np.int32)
    want_o, want_s = _reference(gdn_ref, *arrays, pool[slots], cu)
    steps = max(lens)
    running = np.arange(steps)[:, None] < np.array(lens)[None, :]
    tok = np.where(running, cu[:-1][None, :] + np.arange(steps)[:, None], 0).astype(np.int32)
    idx = np.where(running, slots[None, :], -1).astype(np.int32)

    @functools.partial(jax.jit, donate_argnums=5)
    def run(q, k, v, g, beta, pool, tok, idx):
        def step(pool, x):
            t, i = x
            o, pool = kj.fused_recurrent_gated_delta_rule_fwd(q[0, t][:, None], k[0, t][:, None], v[0, t][:, None],
                                                              g[0, t][:, None], beta[0, t][:, None], None, pool,
                                                              ssm_state_indices=i, use_qk_l2norm_in_kernel=True,
                                                              kernel=backend)
            return pool, o[:, 0]

        pool, o = jax.lax.scan(step, pool, (tok, idx))
        return o, pool

    o_steps, new = run(*(jnp.asarray(x) for x in arrays), jnp.asarray(pool), jnp.asarray(tok), jnp.asarray(idx))
    o_steps, new = np.asarray(o_steps), np.asarray(new)
    assert not o_steps[~running].any(), "padding entries output zeros"
    o = np.zeros_like(want_o)
    o[tok[running]] = o_steps[running]
    check_f32(o, want_o, what=f"{backend} decode o")
    for n, slot in enumerate(slots):
        check_state(new[slot], want_s[n], what=f"{backend} slot {slot}")
    for slot in (1, 3, 5):
        np.testing.assert_array_equal(new[slot], pool[slot])
    # One more step, the pool donated to an outer jit: the kernel writes into the caller's buffer.
    q1, k1, v1, g1, b1 = (jnp.asarray(x[:, :3].reshape((3, 1) + x.shape[2:])) for x in arrays)
    step = jax.jit(lambda pool, i: kj.fused_recurrent_gated_delta_rule_fwd(
        q1, k1, v1, g1, b1, initial_state=pool, ssm_state_indices=i, use_qk_l2norm_in_kernel=True, kernel=backend),
        donate_argnums=0)
    p = jnp.asarray(new)
    ptr = p.unsafe_buffer_pointer()
    o1, after = step(p, jnp.asarray([1, -1, 5], jnp.int32))
    assert p.is_deleted() and after.unsafe_buffer_pointer() == ptr
    w_o, w_s = _reference(gdn_ref, *(np.asarray(x) for x in (q1, k1, v1, g1, b1)), new[[1, 1, 5]], _rows(3, 1))
    check_f32(o1[0], w_o[0], what="step o")
    assert not np.asarray(o1[1]).any()
    check_state(after[1], w_s[0], what="step slot 1")
    check_state(after[5], w_s[2], what="step slot 5")
    np.testing.assert_array_equal(after[4], new[4])


def _draft_problem(ref):
    """Three sequences of 3, 2 and 1 draft tokens with 2-D slots [3, 3] and accepted counts [2, 1, 1]:
    sequence 0 starts from slot [0, 1], sequence 1 from [1, 0], sequence 2 reads slot [2, 0] = -1
    (padding). The reference: the state after every token, per sequence."""
    H, HV, K, V = 1, 4, 12, 8
    arrays, rng = _problem(51, 1, 6, H, HV, K, V)
    cu = np.array([0, 3, 5, 6], np.int32)
    pool = rng.standard_normal((8, HV, K, V)).astype(np.float32)
    idx = np.array([[0, 1, 2], [3, 4, -1], [-1, 5, 6]], np.int32)
    accepted = np.array([2, 1, 1], np.int32)
    start = {0: pool[1], 1: pool[3]}
    want_o = np.zeros(arrays[2].shape[1:])
    after = {}  # (sequence, token) -> state after the token
    for n, s0 in start.items():
        for t in range(cu[n + 1] - cu[n]):
            sl = slice(cu[n], cu[n] + t + 1)
            o, s = ref.recurrent(*(np.asarray(x[0, sl], np.float64) for x in arrays), s0.astype(np.float64))
            want_o[cu[n] + t] = o[-1]
            after[n, t] = s
    return arrays, cu, pool, idx, accepted, want_o, after


def test_fwd_speculative_slots_under_jit_with_donation(backend, gdn_ref):
    """2-D ssm_state_indices with num_accepted_tokens: the state after token t to slot [n, t] (negative: not
    written), the padding sequence untouched, the pool donated to the jitted step and updated in place;
    with inplace_final_state=False the state after every token is returned (default output_final_state)."""
    arrays, cu, pool, idx, accepted, want_o, after = _draft_problem(gdn_ref)
    xs = [jnp.asarray(x) for x in (*arrays, cu, idx, accepted)]
    step = jax.jit(lambda pool, q, k, v, g, b, cu, idx, acc: kj.fused_recurrent_gated_delta_rule_fwd(
        q, k, v, g, b, None, pool, True, cu, idx, acc, use_qk_l2norm_in_kernel=True, kernel=backend),
        donate_argnums=0)
    p = jnp.asarray(pool)
    ptr = p.unsafe_buffer_pointer()
    o, new = step(p, *xs)
    assert p.is_deleted() and new.unsafe_buffer_pointer() == ptr
    o, new = np.asarray(o[0]), np.asarray(new)
    check_f32(o[:5], want_o[:5], what=f"{backend} o")
    assert not o[5].any()
    for (n, t), s in after.items():
        check_state(new[idx[n, t]], s, what=f"{backend} sequence {n} token {t}")
    for slot in (5, 6, 7):
        np.testing.assert_array_equal(new[slot], pool[slot])
    # inplace_final_state=False: the pool only read; row bos + t holds the state after token t. o goes to out's
    # buffer (donated).
    keep, out = jnp.asarray(pool), jnp.zeros(xs[2].shape, jnp.float32)
    ptr = out.unsafe_buffer_pointer()
    o2, per_token = kj.fused_recurrent_gated_delta_rule_fwd(*xs[:5], initial_state=keep, inplace_final_state=False,
                                                            cu_seqlens=xs[5], ssm_state_indices=xs[6],
                                                            num_accepted_tokens=xs[7], use_qk_l2norm_in_kernel=True,
                                                            out=out, kernel=backend)
    assert not keep.is_deleted() and per_token.shape == (6, 4, 12, 8)
    assert out.is_deleted() and (backend != "ffi" or o2.unsafe_buffer_pointer() == ptr)
    check_f32(o2[0, :5], want_o[:5], what="o, states per token")
    for (n, t), s in after.items():
        check_state(per_token[cu[n] + t], s, what=f"row {cu[n] + t}")
    assert not np.asarray(per_token[5]).any()


def test_index_values_checked_at_run_time_under_jit(backend):
    """Traced indices: a bad value fails the call when it runs, the message naming the GDN entry."""
    arrays, _ = _problem(61, 2, 1, 1, 2, 8, 8)
    q, k, v, g, b = (jnp.asarray(x) for x in arrays)
    step = jax.jit(lambda pool, idx, acc: kj.fused_recurrent_gated_delta_rule_fwd(
        q, k, v, g, b, initial_state=pool, ssm_state_indices=idx, num_accepted_tokens=acc, kernel=backend))
    pool = jnp.zeros((3, 2, 8, 8))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"fused_recurrent_gated_delta_rule: ssm_state_indices\[1, 0\] = 3 is out of range"):
        jax.block_until_ready(step(pool, jnp.asarray([[0, 1], [3, 2]], jnp.int32), jnp.ones(2, jnp.int32)))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"num_accepted_tokens\[1\] = 3 must be in \[1, 2\]"):
        jax.block_until_ready(step(pool, jnp.asarray([[0, 1], [2, -1]], jnp.int32), jnp.asarray([1, 3], jnp.int32)))
    run = jax.jit(lambda cu: kj.chunk_gated_delta_rule(q.reshape(1, 2, 1, 8), k.reshape(1, 2, 1, 8),
                                                       v.reshape(1, 2, 2, 8), g.reshape(1, 2, 2), b.reshape(1, 2, 2),
                                                       cu_seqlens=cu, kernel=backend))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"chunk_gated_delta_rule: cu_seqlens\[N\] must equal T"):
        jax.block_until_ready(run(jnp.asarray([0, 1, 3], jnp.int32)))


# --- half precision ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_against_reference(dtype, backend, gdn_ref):
    """bf16 / fp16 operands: read as given, fp32 inside, o rounded once to q's dtype; fp32 states."""
    B, T, H, HV, K, V = 2, 11, 2, 4, 16, 24
    arrays, rng = _problem(71, B, T, H, HV, K, V)
    half = [np.asarray(jnp.asarray(x).astype(dtype)) for x in arrays]
    init = rng.standard_normal((B, HV, K, V)).astype(np.float32)
    want_o, want_s = _reference(gdn_ref, *half, init, _rows(B, T))
    xs = [jnp.asarray(x) for x in half]
    kw = dict(initial_state=jnp.asarray(init), output_final_state=True, use_qk_l2norm_in_kernel=True, kernel=backend)
    for name, (o, s) in (("chunk", kj.chunk_gated_delta_rule(*xs, **kw)),
                         ("recurrent", kj.fused_recurrent_gated_delta_rule(*xs[:4], beta=xs[4], **kw))):
        assert o.dtype == dtype and s.dtype == jnp.float32
        _check_half(o, want_o.reshape(o.shape), dtype, f"{backend} {name} {jnp.dtype(dtype).name} o")
        check_state(s, want_s, what=f"{backend} {name} {jnp.dtype(dtype).name} state")


# --- the FFI kernels are the numpy entries' kernels --------------------------------------------------------


def test_ffi_matches_numpy_entries():
    """The options the reference cannot express (beta per value, the KDA decay) and the others: the FFI
    kernels' results are the numpy entries', bit for bit."""
    ffi_or_skip()
    import kda

    B, T, H, HV, K, V = 1, 9, 1, 2, 8, 12
    (q, k, v, g, beta), rng = _problem(81, B, T, H, HV, K, V)
    a_log, dt_bias = rng.standard_normal(HV).astype(np.float32), rng.standard_normal(HV).astype(np.float32)
    kw = dict(output_final_state=True, use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
              use_beta_sigmoid_in_kernel=True, state_v_first=True)
    want = kda.chunk_gated_delta_rule(q, k, v, g, beta, **kw, chunk_size=16)
    got = kj.chunk_gated_delta_rule(*(jnp.asarray(x) for x in (q, k, v, g, beta)), **kw, chunk_size=16, kernel="ffi")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    bpv = rng.uniform(0, 1, (B, T, HV, V)).astype(np.float32)
    want = kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=bpv, **kw)
    got = kj.fused_recurrent_gated_delta_rule(*(jnp.asarray(x) for x in (q, k, v, g)), beta=jnp.asarray(bpv), **kw,
                                              kernel="ffi")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


# --- fused_gdn_gate ----------------------------------------------------------------------------------------


def test_fused_gdn_gate():
    rng = np.random.default_rng(90)
    g = (rng.standard_normal((3, 5, 4)) * 15).astype(np.float32)  # both softplus branches
    a_log, dt_bias = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    want = -np.exp(a_log.astype(np.float64)) * _softplus(g + dt_bias.astype(np.float64))
    got = jax.jit(lambda g: kj.fused_gdn_gate(g, a_log, dt_bias))(jnp.asarray(g))
    assert got.dtype == jnp.float32 and got.shape == g.shape
    check_f32(got, want, what="gate")
    check_f32(kj.fused_gdn_gate(g, a_log), -np.exp(a_log.astype(np.float64)) * _softplus(g.astype(np.float64)),
              what="gate without dt_bias")
    assert kj.fused_gdn_gate(jnp.asarray(g), a_log, output_dtype=jnp.bfloat16).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="fused_gdn_gate: A_log is required"):
        kj.fused_gdn_gate(g, None)
    with pytest.raises(ValueError, match=r"fused_gdn_gate: dt_bias: expected HV = 4 elements"):
        kj.fused_gdn_gate(g, a_log, np.zeros(16, np.float32))


# --- bad arguments, named --------------------------------------------------------------------------------------


def _ok():
    arrays, _ = _problem(0, 1, 4, 2, 2, 16, 8)
    return [jnp.asarray(x) for x in arrays]


# (entry, make the bad arguments, exception, message), the same for both backends.
BAD = [
    ("chunk", lambda q, k, v, g, b: dict(g=jnp.zeros((1, 4, 2, 16))), ValueError,
     r"chunk_gated_delta_rule: g: expected shape \[B, T, HV\] \(HV of v\) = \[1, 4, 2\]"),
    ("chunk", lambda q, k, v, g, b: dict(chunk_size=48), ValueError,
     "chunk_gated_delta_rule: `chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got 48."),
    ("chunk", lambda q, k, v, g, b: dict(use_gate_in_kernel=True), ValueError,
     "chunk_gated_delta_rule: A_log: required with use_gate_in_kernel=True"),
    ("chunk", lambda q, k, v, g, b: dict(use_gate_in_kernel=True, A_log=jnp.zeros(2), dt_bias=jnp.zeros(32)),
     ValueError, r"chunk_gated_delta_rule: dt_bias: expected HV = 2 elements"),
    ("chunk", lambda q, k, v, g, b: dict(initial_state=jnp.zeros((2, 2, 16, 8))), ValueError,
     r"chunk_gated_delta_rule: initial_state: expected shape \[N, HV, K, V\] = \[1, 2, 16, 8\]"),
    ("chunk", lambda q, k, v, g, b: dict(return_intermediate_states=True), TypeError,
     r"chunk_gated_delta_rule\(\) got an unexpected keyword argument 'return_intermediate_states'"),
    ("chunk", lambda q, k, v, g, b: dict(lower_bound=-1.0), TypeError,
     r"chunk_gated_delta_rule\(\) got an unexpected keyword argument 'lower_bound'"),
    ("chunk", lambda q, k, v, g, b: dict(cp_context=object()), NotImplementedError,
     "chunk_gated_delta_rule: cp_context"),
    ("chunk", lambda q, k, v, g, b: dict(allow_neg_eigval=True), ValueError,
     "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    ("chunk", lambda q, k, v, g, b: dict(scale="x"), TypeError, "chunk_gated_delta_rule: scale must be a Python float"),
    ("chunk", lambda q, k, v, g, b: dict(state_indices=jnp.asarray([4], jnp.int32),
                                         initial_state=jnp.zeros((3, 2, 16, 8))), ValueError,
     r"chunk_gated_delta_rule: state_indices\[0\] = 4 is out of range"),
    ("chunk", lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0, 2, 5], jnp.int32), cu_seqlens_cpu=[0, 3, 4]),
     ValueError, r"chunk_gated_delta_rule: cu_seqlens_cpu: must hold cu_seqlens' values"),
    ("recurrent", lambda q, k, v, g, b: dict(gk=g), ValueError,
     r"fused_recurrent_gated_delta_rule: gk: expected shape \[B, T, HV, K\]"),
    ("recurrent", lambda q, k, v, g, b: dict(gv=v), NotImplementedError, "fused_recurrent_gated_delta_rule: gv"),
    ("recurrent", lambda q, k, v, g, b: dict(g=None, use_gate_in_kernel=True, A_log=jnp.zeros(2)), ValueError,
     "`g` .* must be provided when `use_gate_in_kernel=True`"),
    ("recurrent", lambda q, k, v, g, b: dict(beta=jnp.zeros((1, 4, 3))), ValueError,
     r"fused_recurrent_gated_delta_rule: beta: expected shape \[B, T, HV\]"),
    ("recurrent", lambda q, k, v, g, b: dict(initial_state=jnp.zeros((5, 2, 16, 8)),
                                             ssm_state_indices=jnp.asarray([0]), num_accepted_tokens=jnp.asarray([1])),
     ValueError, r"fused_recurrent_gated_delta_rule: num_accepted_tokens needs 2-D ssm_state_indices"),
    ("recurrent", lambda q, k, v, g, b: dict(foo=1), TypeError,
     r"fused_recurrent_gated_delta_rule\(\) got an unexpected keyword argument 'foo'"),
    ("fwd", lambda q, k, v, g, b: dict(retrieve_parent_token=jnp.zeros(4, jnp.int32)), NotImplementedError,
     "fused_recurrent_gated_delta_rule_fwd: retrieve_parent_token"),
    ("fwd", lambda q, k, v, g, b: dict(initial_state=None), ValueError,
     "fused_recurrent_gated_delta_rule: initial_state: required with inplace_final_state=True"),
    ("fwd", lambda q, k, v, g, b: dict(ssm_state_indices=jnp.asarray([3])), ValueError,
     r"fused_recurrent_gated_delta_rule: ssm_state_indices\[0\] = 3 is out of range for num_states = 3"),
    ("fwd", lambda q, k, v, g, b: dict(g=None), TypeError,
     "fused_recurrent_gated_delta_rule_fwd: g: expected an array"),
    ("fwd", lambda q, k, v, g, b: dict(lower_bound=-1.0), TypeError,
     r"fused_recurrent_gated_delta_rule_fwd\(\) got an unexpected keyword argument 'lower_bound'"),
]


@pytest.mark.parametrize("entry,make,exc,match", BAD)
def test_bad_arguments(entry, make, exc, match, backend):
    q, k, v, g, b = _ok()
    args = dict(q=q, k=k, v=v, g=g, beta=b)
    if entry == "fwd":
        args["initial_state"] = jnp.zeros((3, 2, 16, 8))
    args.update(make(q, k, v, g, b))
    fn = {"chunk": kj.chunk_gated_delta_rule, "recurrent": kj.fused_recurrent_gated_delta_rule,
          "fwd": kj.fused_recurrent_gated_delta_rule_fwd}[entry]
    with pytest.raises(exc, match=match):
        fn(**args, kernel=backend)
