"""kda.jax: the XLA FFI kernels and the pure-JAX naive kernels, under jax.jit, against the golden
kernel outputs and each other; state pools and their aliasing; bad arguments; the fallback.

Run by `make test-python` against the installed package; from a CMake build of the library
(-DKDA_BUILD_XLA_FFI=ON), point $KDA_XLA_FFI_LIBRARY at build/python/xla_ffi/libkda_xla_ffi.so.

Without the library the FFI tests skip (KDA_REQUIRE_XLA_FFI=1 makes them fail); without the golden
data the golden tests skip (KDA_REQUIRE_GOLDEN=1 makes them fail). Tolerances are design §5's fp32
rule (base/tolerance.cc), as tests/layer_golden_test.cc applies it to the same kernel outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kda.jax as kj
from kda.jax import ffi as kffi

from golden import check_f32, golden_set_dir, load_case, read_safetensors, ulp_bf16
from golden import check_state_f32 as check_state
from golden import golden_cases as _all_golden_cases

SETS = ("kda-mini", "kda-stress", "kda-loud")
BACKENDS = ("ffi", "naive")


def golden_cases() -> list[tuple[str, str]]:
    """The kernel-level golden cases of the sets above (the real-shape set is too slow for the naive scan)."""
    return [(s, c) for s, c in _all_golden_cases() if s in SETS]


def check_bf16_output(a, r, what=""):
    """Two bf16 outputs of the same fp32 math: the fp32 rule plus one bf16 rounding step of either."""
    a = np.asarray(a, np.float64).ravel()
    r = np.asarray(r, np.float64).ravel()
    tol = 1e-5 + 1e-5 * np.abs(r) + ulp_bf16(np.maximum(np.abs(a), np.abs(r)))
    d = np.abs(a - r)
    bad = ~(d <= tol)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {a.size} outside, max err/tol {np.nanmax(d / tol)}"


# --- fixtures ------------------------------------------------------------------------------------


def _ffi_or_skip():
    if not kffi.load():
        msg = f"kda XLA FFI library not available: {kffi.load_error()}"
        if os.environ.get("KDA_REQUIRE_XLA_FFI") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "ffi":
        _ffi_or_skip()
    return request.param


def _model_gate(set_name: str):
    m = read_safetensors(golden_set_dir(set_name) / "model.safetensors")
    a_log = m["model.layers.0.self_attn.A_log"]
    dt_bias = m["model.layers.0.self_attn.dt_bias"]
    return jnp.asarray(a_log), jnp.asarray(dt_bias)  # bf16, as in the checkpoint


def _golden_inputs(c):
    T, H, K = c["q_conv"].shape
    q, k, v, g, g_raw = (jnp.asarray(c[n]).reshape(1, T, H, K) for n in ("q_conv", "k_conv", "v_conv", "g", "g_raw"))
    beta = jnp.asarray(c["beta"]).reshape(1, T, H)
    cu = jnp.asarray(c["cu_seqlens"])
    N = cu.shape[0] - 1
    init = jnp.asarray(c["initial_recurrent_state"]) if "initial_recurrent_state" in c else None
    return q, k, v, g, g_raw, beta, cu, N, init


# --- golden: the chunk kernel, the decode kernel step by step, the gate in the kernel ------------


@pytest.mark.parametrize("set_name,case", golden_cases())
def test_chunk_golden(set_name, case, backend):
    c = load_case(set_name, case)
    q, k, v, g, g_raw, beta, cu, N, init = _golden_inputs(c)

    @jax.jit
    def run(q, k, v, g, beta, cu, init):
        return kj.chunk_kda(q, k, v, g, beta, initial_state=init, output_final_state=True,
                           use_qk_l2norm_in_kernel=True, cu_seqlens=cu, kernel=backend)

    o, s = run(q, k, v, g, beta, cu, init)
    check_f32(o[0], c["o_kda"], what=f"{backend} chunk o")
    check_state(s, c["final_recurrent_state"], what=f"{backend} chunk final state")

    # The raw gate activated in the kernel (A_log, dt_bias of layer 0 from the checkpoint, bf16).
    a_log, dt_bias = _model_gate(set_name)

    @jax.jit
    def run_gate(q, k, v, g_raw, beta, cu, init, a_log, dt_bias):
        return kj.chunk_kda(q, k, v, g_raw, beta, initial_state=init, output_final_state=True,
                           use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, cu_seqlens=cu, A_log=a_log,
                           dt_bias=dt_bias, kernel=backend)

    o, s = run_gate(q, k, v, g_raw, beta, cu, init, a_log, dt_bias)
    check_f32(o[0], c["o_kda"], what=f"{backend} chunk o, gate in kernel")
    check_state(s, c["final_recurrent_state"], what=f"{backend} chunk final state, gate in kernel")


def _decode_schedule(cu: np.ndarray):
    """Step t decodes token cu[n] + t of every sequence n still running; the others are padding (-1)."""
    lens = np.diff(cu)
    steps = max(int(lens.max()), 1)
    n = np.arange(len(lens))
    t = np.arange(steps)[:, None]
    running = t < lens[None, :]
    tok = np.where(running, cu[:-1][None, :] + t, 0).astype(np.int32)
    idx = np.where(running, n[None, :], -1).astype(np.int32)
    return tok, idx


@pytest.mark.parametrize("set_name,case", golden_cases())
def test_decode_golden(set_name, case, backend):
    """Every sequence token by token through fused_recurrent_kda in one jitted lax.scan, finished
    sequences as padding entries (negative index), the state pool donated through the loop."""
    c = load_case(set_name, case)
    q, k, v, g, g_raw, beta, cu, N, init = _golden_inputs(c)
    H, K = q.shape[2], q.shape[3]
    tok, idx = _decode_schedule(np.asarray(c["cu_seqlens"]))
    pool = init if init is not None else jnp.zeros((N, H, K, K), jnp.float32)

    @jax.jit
    def run(q, k, v, g, beta, pool, tok, idx):
        def step(pool, x):
            tk, ix = x
            o, pool = kj.fused_recurrent_kda(q[0, tk][:, None], k[0, tk][:, None], v[0, tk][:, None],
                                             g[0, tk][:, None], beta[0, tk][:, None], initial_state=pool,
                                             ssm_state_indices=ix, use_qk_l2norm_in_kernel=True, kernel=backend)
            return pool, o[:, 0]

        pool, o = jax.lax.scan(step, pool, (tok, idx))
        return o, pool

    o_steps, pool = run(q, k, v, g, beta, pool, jnp.asarray(tok), jnp.asarray(idx))
    o_steps = np.asarray(o_steps)
    running = idx >= 0
    assert np.all(o_steps[~running] == 0), "padding entries must output zeros"
    o = np.zeros_like(c["o_kda"])
    o[tok[running]] = o_steps[running]
    check_f32(o, c["o_kda"], what=f"{backend} decode o")
    check_state(pool, c["final_recurrent_state"], what=f"{backend} decode final state")


# --- FFI vs naive on random inputs -------------------------------------------------------------


def _random(rng, B, T, H, K, dtype=jnp.float32, gate_scale=1.0):
    def f(*s):
        return rng.standard_normal(s).astype(np.float32)

    q, k, v = (jnp.asarray(f(B, T, H, K)).astype(dtype) for _ in range(3))
    g = jnp.asarray(-np.abs(f(B, T, H, K)) * gate_scale)
    beta = jnp.asarray(1 / (1 + np.exp(-f(B, T, H))))
    return q, k, v, g, beta


def test_ffi_matches_naive_batched_with_initial_state():
    _ffi_or_skip()
    rng = np.random.default_rng(1)
    B, T, H, K = 3, 70, 2, 32
    q, k, v, g, beta = _random(rng, B, T, H, K, gate_scale=5.0)
    init = jnp.asarray(rng.standard_normal((B, H, K, K)).astype(np.float32))
    run = jax.jit(kj.chunk_kda, static_argnames=("output_final_state", "use_qk_l2norm_in_kernel", "kernel"))
    for ofs in (True, False):
        o1, s1 = run(q, k, v, g, beta, initial_state=init, output_final_state=ofs, use_qk_l2norm_in_kernel=True,
                     kernel="ffi")
        o2, s2 = run(q, k, v, g, beta, initial_state=init, output_final_state=ofs, use_qk_l2norm_in_kernel=True,
                     kernel="naive")
        check_f32(o1, o2, what="o")
        if ofs:
            check_state(s1, s2, what="final state")
        else:
            assert s1 is None and s2 is None
    # Batched rows are independent sequences: the same as the packed form.
    cu = jnp.asarray(np.arange(B + 1, dtype=np.int64) * T)  # int64 accepted (cast to int32)
    flat = [x.reshape((1, B * T) + x.shape[2:]) for x in (q, k, v, g, beta)]
    o3, s3 = kj.chunk_kda(*flat, initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True,
                          cu_seqlens=cu, kernel="ffi")
    o1, s1 = kj.chunk_kda(q, k, v, g, beta, initial_state=init, output_final_state=True,
                          use_qk_l2norm_in_kernel=True, kernel="ffi")
    np.testing.assert_array_equal(np.asarray(o3).reshape(o1.shape), o1)
    np.testing.assert_array_equal(s3, s1)


def test_ffi_matches_naive_bf16_and_default_scale():
    _ffi_or_skip()
    rng = np.random.default_rng(2)
    B, T, H, K = 2, 40, 2, 64
    q, k, v, g, beta = _random(rng, B, T, H, K, dtype=jnp.bfloat16)
    g, beta = g.astype(jnp.bfloat16), beta.astype(jnp.bfloat16)
    outs = {}
    for b in BACKENDS:
        outs[b] = jax.jit(lambda *a, b=b: kj.chunk_kda(*a, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                                       kernel=b))(q, k, v, g, beta)
        assert outs[b][0].dtype == jnp.bfloat16 and outs[b][1].dtype == jnp.float32
    check_bf16_output(outs["ffi"][0].astype(jnp.float32), outs["naive"][0].astype(jnp.float32), what="bf16 o")
    check_state(outs["ffi"][1], outs["naive"][1], what="bf16 final state")
    # scale=None is K^-0.5.
    o, _ = kj.chunk_kda(q, k, v, g, beta, scale=K**-0.5, use_qk_l2norm_in_kernel=True, kernel="ffi")
    np.testing.assert_array_equal(o, outs["ffi"][0])
    # Decode with bf16 operands, fp32 pool.
    pool = jnp.zeros((B, H, K, K), jnp.float32)
    d = {b: kj.fused_recurrent_kda(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], initial_state=pool,
                                   inplace_final_state=False, kernel=b) for b in BACKENDS}
    check_bf16_output(d["ffi"][0].astype(jnp.float32), d["naive"][0].astype(jnp.float32), what="decode bf16 o")
    check_state(d["ffi"][1], d["naive"][1], what="decode bf16 state")


def test_gate_in_kernel_without_dt_bias_matches_naive():
    _ffi_or_skip()
    rng = np.random.default_rng(3)
    B, T, H, K = 1, 33, 3, 16
    q, k, v, g, beta = _random(rng, B, T, H, K)
    g_raw = jnp.asarray(rng.standard_normal((B, T, H, K)).astype(np.float32) * 10)  # both softplus branches
    a_log = jnp.asarray(rng.standard_normal(H).astype(np.float32))
    # (q, k normalised: with |k|^2 ~ K the delta rule's I - beta k k^T would amplify rounding.)
    res = [kj.chunk_kda(q, k, v, g_raw, beta, output_final_state=True, use_qk_l2norm_in_kernel=True,
                        use_gate_in_kernel=True, A_log=a_log, kernel=b) for b in BACKENDS]
    check_f32(res[0][0], res[1][0], what="o")
    check_state(res[0][1], res[1][1], what="state")


# --- state pools ---------------------------------------------------------------------------------


def _pool_problem(seed=4):
    rng = np.random.default_rng(seed)
    H, K = 2, 32
    lens = [5, 0, 17, 9]  # a zero-length sequence
    T = sum(lens)
    q, k, v, g, beta = _random(rng, 1, T, H, K, gate_scale=3.0)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    pool = jnp.asarray(rng.standard_normal((7, H, K, K)).astype(np.float32))
    idx = jnp.asarray([4, 2, -1, 0], jnp.int32)  # sequence 2 is padding
    return q, k, v, g, beta, cu, pool, idx, lens


def test_chunk_pool_form_matches_contiguous(backend):
    q, k, v, g, beta, cu, pool, idx, lens = _pool_problem()
    pool_np = np.asarray(pool)
    o, new_pool = kj.chunk_kda(q, k, v, g, beta, initial_state=jnp.array(pool), cu_seqlens=cu,
                               state_indices=idx, use_qk_l2norm_in_kernel=True, kernel=backend)
    # The same sequences in the contiguous form, from the pool's states.
    init = jnp.asarray(pool_np[[4, 2, 0, 0]])
    o_c, s_c = kj.chunk_kda(q, k, v, g, beta, initial_state=init, cu_seqlens=cu, output_final_state=True,
                            use_qk_l2norm_in_kernel=True, kernel=backend)
    o, o_c, new_pool, s_c = map(np.asarray, (o, o_c, new_pool, s_c))
    pad = slice(5, 22)  # the padding sequence's tokens
    assert np.all(o[0, pad] == 0)
    check_f32(o[0, :5], o_c[0, :5], what="seq 0")
    check_f32(o[0, 22:], o_c[0, 22:], what="seq 3")
    check_state(new_pool[4], s_c[0], what="slot 4")
    check_state(new_pool[0], s_c[3], what="slot 0")
    # A zero-length sequence keeps its slot; untouched slots stay bit-identical.
    for s in (1, 2, 3, 5, 6):
        np.testing.assert_array_equal(new_pool[s], pool_np[s], err_msg=f"slot {s}")


def test_chunk_pool_ffi_matches_naive():
    _ffi_or_skip()
    q, k, v, g, beta, cu, pool, idx, _ = _pool_problem(5)
    res = [kj.chunk_kda(q, k, v, g, beta, initial_state=jnp.array(pool), cu_seqlens=cu, state_indices=idx,
                        use_qk_l2norm_in_kernel=True, kernel=b) for b in BACKENDS]
    check_f32(res[0][0], res[1][0], what="o")
    check_state(res[0][1], res[1][1], what="pool")


def test_pool_donated_and_updated_in_place_eagerly(backend):
    q, k, v, g, beta, cu, pool, idx, _ = _pool_problem(6)
    p = jnp.array(pool)
    ptr = p.unsafe_buffer_pointer()
    _, new = kj.chunk_kda(q, k, v, g, beta, initial_state=p, cu_seqlens=cu, state_indices=idx, kernel=backend)
    assert p.is_deleted(), "the pool is donated"
    assert new.unsafe_buffer_pointer() == ptr, "the kernel wrote into the donated buffer"
    # Decode likewise, and not with inplace_final_state=False.
    dq, dk, dv, dg, db = (x[:, :4].reshape((4, 1) + x.shape[2:]) for x in (q, k, v, g, beta))
    ptr = new.unsafe_buffer_pointer()
    _, new2 = kj.fused_recurrent_kda(dq, dk, dv, dg, db, initial_state=new, ssm_state_indices=idx, kernel=backend)
    assert new.is_deleted() and new2.unsafe_buffer_pointer() == ptr
    keep = jnp.array(new2)
    _, new3 = kj.fused_recurrent_kda(dq, dk, dv, dg, db, initial_state=keep, ssm_state_indices=idx,
                                     inplace_final_state=False, kernel=backend)
    assert not keep.is_deleted()
    assert not np.array_equal(np.asarray(keep), np.asarray(new3))


def test_pool_aliased_under_jit_with_donation(backend):
    """Under an outer jit the pool is updated in place when the caller donates it."""
    rng = np.random.default_rng(7)
    N, H, K = 3, 2, 16
    q, k, v, g, beta = _random(rng, N, 1, H, K)
    pool = jnp.asarray(rng.standard_normal((5, H, K, K)).astype(np.float32))
    idx = jnp.asarray([3, -1, 1], jnp.int32)
    expect_o, expect_pool = kj.fused_recurrent_kda(q, k, v, g, beta, initial_state=jnp.array(pool),
                                                   ssm_state_indices=idx, kernel="naive")

    @jax.jit
    def step(pool, q, k, v, g, beta, idx):
        return kj.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx, kernel=backend)

    donating = jax.jit(step.__wrapped__, donate_argnums=0)
    p = jnp.array(pool)
    ptr = p.unsafe_buffer_pointer()
    o, new = donating(p, q, k, v, g, beta, idx)
    assert p.is_deleted() and new.unsafe_buffer_pointer() == ptr
    check_f32(o, expect_o, what="o")
    check_state(new, expect_pool, what="pool")
    np.testing.assert_array_equal(o[1], 0)
    for s in (0, 2, 4):
        np.testing.assert_array_equal(new[s], pool[s])
    # Without donation XLA copies: the input stays valid and unchanged.
    p = jnp.array(pool)
    _, new = step(p, q, k, v, g, beta, idx)
    assert not p.is_deleted()
    np.testing.assert_array_equal(p, pool)
    check_state(new, expect_pool, what="pool (copied)")


def test_decode_packed_cu_seqlens_and_fresh_states(backend):
    rng = np.random.default_rng(8)
    N, H, K = 4, 2, 16
    q, k, v, g, beta = _random(rng, 1, N, H, K)
    cu = jnp.arange(N + 1, dtype=jnp.int32)
    o, s = kj.fused_recurrent_kda(q, k, v, g, beta, cu_seqlens=cu, kernel=backend)
    assert s.shape == (N, H, K, K)
    # From zeros one step gives S = beta k v^T: o = beta (scale q . k) v.
    scale = K**-0.5
    want = np.einsum("th,thk,thk,thv->thv", beta[0], q[0] * scale, k[0], v[0])
    check_f32(o[0], want, what="o")
    check_state(s, np.einsum("th,thk,thv->thkv", beta[0], k[0], v[0]), what="state")


# --- bad arguments -------------------------------------------------------------------------------


def _ok(B=1, T=4, H=2, K=16):
    rng = np.random.default_rng(9)
    return _random(rng, B, T, H, K)


# (make the bad arguments, exception, the naive kernels' message, the C++ call description's message).
BAD_CHUNK = [
    (lambda q, k, v, g, b: dict(q=q[0]), ValueError, r"q must be \[B, T, H, K\]",
     r"chunk_kda: q: expected a 4-D array \[B, T, H, K\]"),
    (lambda q, k, v, g, b: dict(k=k[..., :8]), ValueError, r"k must be \[B, T, H, K\] = \[1, 4, 2, 16\]",
     r"k: expected shape \[B, T, H, K\] \(q's shape\) = \[1, 4, 2, 16\]"),
    (lambda q, k, v, g, b: dict(v=v[:, :3]), ValueError, r"v must be \[B, T, H, V\]", r"v: expected shape \[B, T, HV, V\]"),
    (lambda q, k, v, g, b: dict(g=g[..., :1, :]), ValueError, r"g must be \[B, T, H, K\]",
     r"g: expected shape \[B, T, HV, K\]"),
    (lambda q, k, v, g, b: dict(beta=b[..., None]), ValueError, r"beta must be \[B, T, H\] = \[1, 4, 2\]",
     r"beta: expected shape \[B, T, HV\] = \[1, 4, 2\]"),
    (lambda q, k, v, g, b: dict(q=q.astype(jnp.float16), k=k.astype(jnp.float16), v=v.astype(jnp.float16)),
     TypeError, "q must be float32 or bfloat16", "q must be float32 or bfloat16"),
    (lambda q, k, v, g, b: dict(k=k.astype(jnp.bfloat16)), TypeError, "k must have q's dtype",
     "q, k and v must have one dtype, got float32, bfloat16, float32"),
    (lambda q, k, v, g, b: dict(beta=b.astype(jnp.int32)), TypeError, "beta must be float32 or bfloat16",
     "beta: dtype must be float32, bfloat16 or float16, got int32"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((2, 2, 16, 16))), ValueError,
     r"initial_state must be \[N, H, K, V\] = \[1, 2, 16, 16\]",
     r"initial_state: expected shape \[N, HV, K, V\] = \[1, 2, 16, 16\]"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((1, 2, 16, 16), jnp.bfloat16)), TypeError,
     "initial_state must be float32", "initial_state: dtype must be float32, got bfloat16"),
    (lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0, 2, 4], jnp.float32)), TypeError,
     "cu_seqlens must be int32 or int64", "cu_seqlens: dtype must be int32 or int64, got float32"),
    (lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0, 3, 2, 4], jnp.int32)), ValueError,
     "cu_seqlens must be non-decreasing", "cu_seqlens must be non-decreasing"),
    (lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0, 2, 5], jnp.int32)), ValueError,
     r"cu_seqlens\[-1\] must equal the number of tokens 4", r"cu_seqlens\[N\] must equal T, got 5 with T = 4"),
    (lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0], jnp.int32)), ValueError, r"cu_seqlens must be \[N \+ 1\]",
     r"cu_seqlens: expected shape \[N \+ 1\] with N >= 1"),
    (lambda q, k, v, g, b: dict(state_indices=jnp.asarray([0], jnp.int32)), ValueError,
     "state_indices needs initial_state", "state_indices: needs the state pool"),
    (lambda q, k, v, g, b: dict(state_indices=jnp.asarray([3], jnp.int32), initial_state=jnp.zeros((3, 2, 16, 16))),
     ValueError, r"state_indices\[0\] = 3 is out of range", r"state_indices\[0\] = 3 is out of range"),
    (lambda q, k, v, g, b: dict(state_indices=jnp.asarray([0, 1], jnp.int32), initial_state=jnp.zeros((3, 2, 16, 16))),
     ValueError, r"state_indices must be \[N\] = \[1\]", r"state_indices: expected shape \[N\] = \[1\]"),
    (lambda q, k, v, g, b: dict(use_gate_in_kernel=True), ValueError, "use_gate_in_kernel=True requires A_log",
     "A_log: required with use_gate_in_kernel=True"),
    (lambda q, k, v, g, b: dict(use_gate_in_kernel=True, A_log=jnp.zeros(3)), ValueError, r"A_log must be \[H\] = \[2\]",
     r"A_log: expected HV = 2 elements"),
    (lambda q, k, v, g, b: dict(use_gate_in_kernel=True, A_log=jnp.zeros(2), dt_bias=jnp.zeros(5)), ValueError,
     r"dt_bias must be \[H \* K\] = \[32\]", r"dt_bias: expected HV\*K = 32 elements"),
    (lambda q, k, v, g, b: dict(scale=-1.0), ValueError, "scale must be a finite positive float",
     "scale must be a finite positive float"),
    (lambda q, k, v, g, b: dict(scale="x"), TypeError, "scale must be a Python float", "scale must be a Python float"),
    (lambda q, k, v, g, b: dict(kernel="fast"), ValueError, "kernel must be one of auto, ffi, naive",
     "kernel must be one of auto, ffi, naive"),
]


def _expect(exc, naive_match, ffi_match, backend):
    return pytest.raises(exc, match=ffi_match if backend == "ffi" else naive_match)


@pytest.mark.parametrize("make,exc,naive_match,ffi_match", BAD_CHUNK)
def test_chunk_bad_arguments(make, exc, naive_match, ffi_match, backend):
    q, k, v, g, b = _ok()
    args = dict(q=q, k=k, v=v, g=g, beta=b)
    args.update(make(q, k, v, g, b))
    with _expect(exc, naive_match, ffi_match, backend):
        kj.chunk_kda(**args, **({} if "kernel" in args else {"kernel": backend}))


def test_ffi_takes_any_head_dims():
    """The FFI kernels, like the naive ones, take K != V (here V = 32) and head dims off the register width."""
    _ffi_or_skip()
    q, k, v, g, b = _ok()
    v32 = jnp.asarray(np.random.default_rng(3).standard_normal((1, 4, 2, 32)), jnp.float32)
    o, _ = kj.chunk_kda(q, k, v32, g, b, kernel="ffi")
    want, _ = kj.chunk_kda(q, k, v32, g, b, kernel="naive")
    assert o.shape == (1, 4, 2, 32)
    np.testing.assert_allclose(np.asarray(o), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_chunk_cu_seqlens_needs_packed_batch(backend):
    q, k, v, g, b = _random(np.random.default_rng(0), 2, 4, 2, 16)
    with pytest.raises(ValueError, match="B = 1"):
        kj.chunk_kda(q, k, v, g, b, cu_seqlens=jnp.asarray([0, 8], jnp.int32), kernel=backend)


BAD_DECODE = [
    (lambda q, k, v, g, b: dict(q=q.reshape(2, 2, 2, 16), k=k.reshape(2, 2, 2, 16), v=v.reshape(2, 2, 2, 16),
                                g=g.reshape(2, 2, 2, 16), beta=b.reshape(2, 2, 2)),
     ValueError, "one token per sequence", "one token per sequence"),
    (lambda q, k, v, g, b: dict(q=q.reshape(1, 4, 2, 16), k=k.reshape(1, 4, 2, 16), v=v.reshape(1, 4, 2, 16),
                                g=g.reshape(1, 4, 2, 16), beta=b.reshape(1, 4, 2),
                                cu_seqlens=jnp.asarray([0, 2, 3, 4, 4], jnp.int32)),
     ValueError, "one token per sequence", "one token per sequence"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((3, 2, 16, 16))), ValueError, "the pool needs >= N = 4",
     r"ssm_state_indices\[3\] = 3 is out of range for num_states = 3"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((4, 2, 16, 8))), ValueError,
     r"initial_state must be the state pool \[S, H, K, V\] = \[S, 2, 16, 16\]",
     r"initial_state: expected shape \[S, HV, K, V\] = \[4, 2, 16, 16\]"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((5, 2, 16, 16)), ssm_state_indices=jnp.asarray([0, 1, 1, -1])),
     ValueError, "ssm_state_indices holds state 1 twice",
     r"duplicate state index 1 in ssm_state_indices\[1\] and ssm_state_indices\[2\]"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((5, 2, 16, 16)), ssm_state_indices=jnp.asarray([0, 1, 2])),
     ValueError, r"ssm_state_indices must be \[N\] = \[4\]", r"ssm_state_indices: expected shape \[N\] = \[4\]"),
    (lambda q, k, v, g, b: dict(ssm_state_indices=jnp.asarray([0, 1, 2, 3])), ValueError,
     "ssm_state_indices needs initial_state", "ssm_state_indices: needs the state pool"),
]


@pytest.mark.parametrize("make,exc,naive_match,ffi_match", BAD_DECODE)
def test_decode_bad_arguments(make, exc, naive_match, ffi_match, backend):
    q, k, v, g, b = _random(np.random.default_rng(0), 4, 1, 2, 16)
    args = dict(q=q, k=k, v=v, g=g, beta=b)
    args.update(make(q, k, v, g, b))
    with _expect(exc, naive_match, ffi_match, backend):
        kj.fused_recurrent_kda(**args, kernel=backend)


def test_ffi_checks_values_at_run_time_under_jit():
    """Under jit cu_seqlens and indices are traced: the FFI kernels refuse bad values when they run."""
    _ffi_or_skip()
    q, k, v, g, b = _ok(T=4)
    run = jax.jit(lambda cu: kj.chunk_kda(q, k, v, g, b, cu_seqlens=cu, kernel="ffi"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="cu_seqlens"):
        jax.block_until_ready(run(jnp.asarray([0, 3, 2, 4], jnp.int32)))
    dq, dk, dv, dg, db = _random(np.random.default_rng(0), 2, 1, 2, 16)
    step = jax.jit(lambda pool, idx: kj.fused_recurrent_kda(dq, dk, dv, dg, db, initial_state=pool,
                                                            ssm_state_indices=idx, kernel="ffi"))
    with pytest.raises(jax.errors.JaxRuntimeError, match="duplicate state index 1"):
        jax.block_until_ready(step(jnp.zeros((3, 2, 16, 16)), jnp.asarray([1, 1], jnp.int32)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="out of range"):
        jax.block_until_ready(step(jnp.zeros((3, 2, 16, 16)), jnp.asarray([0, 3], jnp.int32)))


class _FakeDevice:
    platform = "gpu"


class _FakeGpuArray:
    def devices(self):
        return {_FakeDevice()}


def test_non_cpu_array_is_refused_by_the_ffi_kernels():
    with pytest.raises(ValueError, match="q lives on gpu; the kda FFI kernels run on the CPU only"):
        kffi.check_cpu_array("chunk_kda", "q", _FakeGpuArray())
    kffi.check_cpu_array("chunk_kda", "q", jnp.zeros(3))  # a CPU array passes


# --- dispatcher and fallback ----------------------------------------------------------------------


def test_backend_selection():
    assert kj.backend("naive") == "naive"
    before = kj.get_backend_setting()
    try:
        kj.set_backend("naive")
        assert kj.backend() == "naive"
        with pytest.raises(ValueError, match="kernel must be one of"):
            kj.set_backend("gpu")
    finally:
        kj.set_backend(before)
    if kffi.load():
        assert kj.backend("auto") == "ffi" and kj.ffi_load_error() is None


def _run_python(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_fallback_to_naive_when_the_library_cannot_load(tmp_path):
    code = """
import logging, jax.numpy as jnp, numpy as np
logging.basicConfig(level=logging.WARNING)
import kda.jax as kj
q = jnp.ones((1, 3, 1, 16)) * 0.1
o, s = kj.chunk_kda(q, q, q, -jnp.ones((1, 3, 1, 16)), jnp.ones((1, 3, 1)) * 0.5, output_final_state=True)
assert kj.backend() == "naive", kj.backend()
assert "no such file" in kj.ffi_load_error()
try:
    kj.chunk_kda(q, q, q, q, jnp.ones((1, 3, 1)), kernel="ffi")
except RuntimeError as e:
    print("RuntimeError:", e)
print("OK", float(np.asarray(s).sum()))
"""
    r = _run_python(code, {"KDA_XLA_FFI_LIBRARY": str(tmp_path / "libkda_xla_ffi.so")})
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout
    assert "kernel='ffi': the kda XLA FFI kernels are not available" in r.stdout
    warnings = [line for line in r.stderr.splitlines() if "using the pure-JAX naive kernels" in line]
    assert len(warnings) == 1, r.stderr  # logged once
    assert warnings[0].startswith("WARNING:kda.jax:")


def test_library_found_next_to_the_package():
    """Installed layout: kda/libkda_xla_ffi.so beside kda/jax/, found without $KDA_XLA_FFI_LIBRARY."""
    _ffi_or_skip()
    env = {k: v for k, v in os.environ.items() if k != kffi.ENV_LIBRARY}
    code = "import kda, kda.jax as kj; print(kj.backend(), kj.ffi.library_path(), kda.__file__)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    backend_name, lib, init = r.stdout.split()
    assert backend_name == "ffi"
    assert Path(lib) == Path(init).parent / kffi.LIBRARY_NAME


def test_ffi_kernels_follow_the_settings_of_the_kda_module():
    """One libkda in the process: kda.set_kernel_isa chooses the variant the FFI kernels run too."""
    _ffi_or_skip()
    import kda

    rng = np.random.default_rng(7)
    T, H, K = 37, 2, 32
    q, k, v = (rng.standard_normal((1, T, H, K)).astype(np.float32) for _ in range(3))
    g = (-0.5 * rng.random((1, T, H, K))).astype(np.float32)
    beta = rng.random((1, T, H)).astype(np.float32)
    kda.set_kernel_isa("auto")
    best = kda.active_kernel().split("/")[1]
    outputs = {}
    try:
        for isa in dict.fromkeys(("generic", best)):
            kda.set_kernel_isa(isa)
            o_core, s_core = kda.chunk_kda(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                           kernel="optimized")
            o_ffi, s_ffi = kj.chunk_kda(*(jnp.asarray(x) for x in (q, k, v, g, beta)), output_final_state=True,
                                        use_qk_l2norm_in_kernel=True, kernel="ffi")
            np.testing.assert_array_equal(np.asarray(o_ffi), o_core, err_msg=isa)
            np.testing.assert_array_equal(np.asarray(s_ffi), s_core, err_msg=isa)
            outputs[isa] = o_core
    finally:
        kda.set_kernel_isa("auto")
    if best != "generic":  # the variants round differently (FMA, vector width): the check above tells them apart
        assert not np.array_equal(outputs["generic"], outputs[best])
