"""kda.jax: the XLA FFI kernels and the pure-JAX naive kernels, under jax.jit, against the golden
kernel outputs, each other and kda's numpy entries (every option of fla's API); state pools and their
aliasing; bad arguments refused by name; the fallback.

Run by `make test-python` against the installed package; from a CMake build of the library
(-DKDA_BUILD_XLA_FFI=ON), point $KDA_XLA_FFI_LIBRARY at build/python/xla_ffi/libkda_xla_ffi.so.

Without the library the FFI tests skip (KDA_REQUIRE_XLA_FFI=1 makes them fail); without the golden
data the golden tests skip (KDA_REQUIRE_GOLDEN=1 makes them fail). Tolerances are design §5's fp32
rule (base/tolerance.cc), as tests/layer_golden_test.cc applies it to the same kernel outputs.
"""

from __future__ import annotations

import functools
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
from jax_util import BACKENDS, backend, ffi_or_skip  # noqa: F401 (backend: a fixture)

SETS = ("kda-mini", "kda-stress", "kda-loud")


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
            o, pool = kj.fused_recurrent_kda_fwd(q[0, tk][:, None], k[0, tk][:, None], v[0, tk][:, None],
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
    ffi_or_skip()
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
    ffi_or_skip()
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
                                   output_final_state=True, kernel=b) for b in BACKENDS}
    check_bf16_output(d["ffi"][0].astype(jnp.float32), d["naive"][0].astype(jnp.float32), what="decode bf16 o")
    check_state(d["ffi"][1], d["naive"][1], what="decode bf16 state")


def test_gate_in_kernel_without_dt_bias_matches_naive():
    ffi_or_skip()
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
    ffi_or_skip()
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
    before = np.asarray(jnp.array(new))  # a copy: a numpy view of new would keep it from being donated
    _, new2 = kj.fused_recurrent_kda_fwd(dq, dk, dv, dg, db, initial_state=new, ssm_state_indices=idx,
                                         kernel=backend)
    assert new.is_deleted() and new2.unsafe_buffer_pointer() == ptr
    # inplace_final_state=False reads the pool (kept) and returns the state after every token.
    keep = jnp.asarray(before)
    _, per_token = kj.fused_recurrent_kda_fwd(dq, dk, dv, dg, db, initial_state=keep, ssm_state_indices=idx,
                                              inplace_final_state=False, output_final_state=True, kernel=backend)
    assert not keep.is_deleted()
    np.testing.assert_array_equal(keep, before)
    for n, slot in enumerate(np.asarray(idx)):
        want = new2[slot] if slot >= 0 else np.zeros_like(before[0])
        check_state(per_token[n], want, what=f"token {n}")


def test_pool_aliased_under_jit_with_donation(backend):
    """Under an outer jit the pool is updated in place when the caller donates it."""
    rng = np.random.default_rng(7)
    N, H, K = 3, 2, 16
    q, k, v, g, beta = _random(rng, N, 1, H, K)
    pool = jnp.asarray(rng.standard_normal((5, H, K, K)).astype(np.float32))
    idx = jnp.asarray([3, -1, 1], jnp.int32)
    expect_o, expect_pool = kj.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=jnp.array(pool),
                                                       ssm_state_indices=idx, kernel="naive")

    @jax.jit
    def step(pool, q, k, v, g, beta, idx):
        return kj.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx,
                                          kernel=backend)

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
    o, s = kj.fused_recurrent_kda(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True, kernel=backend)
    assert s.shape == (N, H, K, K)
    # From zeros one step gives S = beta k v^T: o = beta (scale q . k) v.
    scale = K**-0.5
    want = np.einsum("th,thk,thk,thv->thv", beta[0], q[0] * scale, k[0], v[0])
    check_f32(o[0], want, what="o")
    check_state(s, np.einsum("th,thk,thv->thkv", beta[0], k[0], v[0]), what="state")


# --- bad arguments: refused by name, by the C++ call description for both backends -----------------


def _ok(B=1, T=4, H=2, K=16):
    rng = np.random.default_rng(9)
    return _random(rng, B, T, H, K)


# (make the bad arguments, exception, message): the same for the FFI and the naive kernels.
BAD_CHUNK = [
    (lambda q, k, v, g, b: dict(q=q[0]), ValueError, r"chunk_kda: q: expected a 4-D array \[B, T, H, K\]"),
    (lambda q, k, v, g, b: dict(k=k[..., :8]), ValueError,
     r"k: expected shape \[B, T, H, K\] \(q's shape\) = \[1, 4, 2, 16\]"),
    (lambda q, k, v, g, b: dict(v=v[:, :3]), ValueError, r"v: expected shape \[B, T, HV, V\]"),
    (lambda q, k, v, g, b: dict(v=jnp.zeros((1, 4, 3, 16)), g=jnp.zeros((1, 4, 3, 16)), beta=jnp.zeros((1, 4, 3))),
     ValueError, "v: the value heads HV = 3 must be a multiple of the query/key heads H = 2"),
    (lambda q, k, v, g, b: dict(g=g[..., :1, :]), ValueError, r"g: expected shape \[B, T, HV, K\]"),
    (lambda q, k, v, g, b: dict(beta=b[..., None]), ValueError, r"beta: expected shape \[B, T, HV\] = \[1, 4, 2\]"),
    (lambda q, k, v, g, b: dict(q=q.astype(jnp.int32)), TypeError, "q: dtype must be float32, bfloat16 or float16"),
    (lambda q, k, v, g, b: dict(k=k.astype(jnp.int16)), TypeError,
     "k: dtype must be float32, bfloat16 or float16, got int16"),
    (lambda q, k, v, g, b: dict(beta=b.astype(jnp.int32)), TypeError,
     "beta: dtype must be float32, bfloat16 or float16, got int32"),
    (lambda q, k, v, g, b: dict(q=jnp.zeros((1, 4, 2, 300)), k=jnp.zeros((1, 4, 2, 300)), g=jnp.zeros((1, 4, 2, 300))),
     ValueError, r"K must be in \[1, 256\], got 300"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((2, 2, 16, 16))), ValueError,
     r"initial_state: expected shape \[N, HV, K, V\] = \[1, 2, 16, 16\]"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((1, 2, 16, 16), jnp.bfloat16)), TypeError,
     "initial_state: dtype must be float32, got bfloat16"),
    (lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0, 2, 4], jnp.float32)), TypeError,
     "cu_seqlens: dtype must be int32 or int64, got float32"),
    (lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0, 3, 2, 4], jnp.int32)), ValueError,
     "cu_seqlens must be non-decreasing"),
    (lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0, 2, 5], jnp.int32)), ValueError,
     r"cu_seqlens\[N\] must equal T, got 5 with T = 4"),
    (lambda q, k, v, g, b: dict(cu_seqlens=jnp.asarray([0], jnp.int32)), ValueError,
     r"cu_seqlens: expected shape \[N \+ 1\] with N >= 1"),
    (lambda q, k, v, g, b: dict(state_indices=jnp.asarray([0], jnp.int32)), ValueError,
     "state_indices: needs the state pool"),
    (lambda q, k, v, g, b: dict(state_indices=jnp.asarray([3], jnp.int32), initial_state=jnp.zeros((3, 2, 16, 16))),
     ValueError, r"state_indices\[0\] = 3 is out of range"),
    (lambda q, k, v, g, b: dict(state_indices=jnp.asarray([0, 1], jnp.int32), initial_state=jnp.zeros((3, 2, 16, 16))),
     ValueError, r"state_indices: expected shape \[N\] = \[1\]"),
    (lambda q, k, v, g, b: dict(use_gate_in_kernel=True), ValueError, "A_log: required with use_gate_in_kernel=True"),
    (lambda q, k, v, g, b: dict(use_gate_in_kernel=True, A_log=jnp.zeros(3)), ValueError,
     r"A_log: expected HV = 2 elements"),
    (lambda q, k, v, g, b: dict(use_gate_in_kernel=True, A_log=jnp.zeros(2), dt_bias=jnp.zeros(5)), ValueError,
     r"dt_bias: expected HV\*K = 32 elements"),
    (lambda q, k, v, g, b: dict(scale=-1.0), ValueError, "scale: must be a finite number > 0"),
    (lambda q, k, v, g, b: dict(scale="x"), TypeError, "scale must be a Python float"),
    (lambda q, k, v, g, b: dict(scale=jnp.float32(0.5) + jnp.zeros(())), None, None),  # a concrete 0-d array: taken
    (lambda q, k, v, g, b: dict(kernel="fast"), ValueError, "kernel must be one of auto, ffi, naive"),
    (lambda q, k, v, g, b: dict(allow_neg_eigval=True), ValueError,
     "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    (lambda q, k, v, g, b: dict(chunk_size=48), ValueError, "`chunk_size` must be either 32 or 64 for KDA, got 48"),
    (lambda q, k, v, g, b: dict(chunk_size=32.0), TypeError, "chunk_size must be a Python int"),
    (lambda q, k, v, g, b: dict(safe_gate=True, use_gate_in_kernel=True, A_log=jnp.zeros(2)), ValueError,
     "lower_bound must be specified when safe_gate=True and use_gate_in_kernel=True"),
    (lambda q, k, v, g, b: dict(safe_gate=True, use_gate_in_kernel=True, lower_bound=-6.0), ValueError,
     r"lower_bound must be in the safe range \[-5, 0\)"),
    (lambda q, k, v, g, b: dict(lower_bound=0.5), ValueError, "lower_bound: must be a finite number <= 0"),
    (lambda q, k, v, g, b: dict(foo=1), TypeError, "chunk_kda\\(\\) got an unexpected keyword argument 'foo'"),
    (lambda q, k, v, g, b: dict(cp_context=object()), NotImplementedError, "cp_context"),
    (lambda q, k, v, g, b: dict(state_v_first=True, transpose_state_layout=True), ValueError,
     "Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`"),
    (lambda q, k, v, g, b: dict(num_chunks=3), ValueError, "num_chunks .* needs return_intermediate_states=True"),
]


def _expect(exc, match):
    return pytest.raises(exc, match=match)


@pytest.mark.parametrize("make,exc,match", BAD_CHUNK)
def test_chunk_bad_arguments(make, exc, match, backend):
    q, k, v, g, b = _ok()
    args = dict(q=q, k=k, v=v, g=g, beta=b)
    args.update(make(q, k, v, g, b))
    run = functools.partial(kj.chunk_kda, **args, **({} if "kernel" in args else {"kernel": backend}))
    if exc is None:
        o, _ = run()
        assert o.shape == v.shape
        return
    with _expect(exc, match):
        run()


def test_ffi_takes_any_head_dims():
    """The FFI kernels, like the naive ones, take K != V (here V = 32) and head dims off the register width."""
    ffi_or_skip()
    q, k, v, g, b = _ok()
    v32 = jnp.asarray(np.random.default_rng(3).standard_normal((1, 4, 2, 32)), jnp.float32)
    o, _ = kj.chunk_kda(q, k, v32, g, b, kernel="ffi")
    want, _ = kj.chunk_kda(q, k, v32, g, b, kernel="naive")
    assert o.shape == (1, 4, 2, 32)
    check_f32(o, want, what="o")


def test_chunk_cu_seqlens_needs_packed_batch(backend):
    q, k, v, g, b = _random(np.random.default_rng(0), 2, 4, 2, 16)
    with pytest.raises(ValueError, match="B = 1"):
        kj.chunk_kda(q, k, v, g, b, cu_seqlens=jnp.asarray([0, 8], jnp.int32), kernel=backend)


def _pool5():
    return jnp.zeros((5, 2, 16, 16))


def _slots(*rows):
    return jnp.asarray(rows, jnp.int32)


BAD_RECURRENT = [
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((3, 2, 16, 16)), inplace_final_state=True), ValueError,
     r"initial_state: expected shape \[N, HV, K, V\] = \[4, 2, 16, 16\], got \[3, 2, 16, 16\]"),
    (lambda q, k, v, g, b: dict(initial_state=jnp.zeros((4, 2, 16, 8))), ValueError,
     r"initial_state: expected shape \[N, HV, K, V\] = \[4, 2, 16, 16\]"),
    (lambda q, k, v, g, b: dict(initial_state=_pool5(), ssm_state_indices=jnp.asarray([0, 1, 1, -1])), ValueError,
     r"duplicate state index 1 in ssm_state_indices\[1\] and ssm_state_indices\[2\]"),
    (lambda q, k, v, g, b: dict(initial_state=_pool5(), ssm_state_indices=jnp.asarray([0, 1, 2])), ValueError,
     r"ssm_state_indices: expected shape \[N\] = \[4\]"),
    (lambda q, k, v, g, b: dict(initial_state=_pool5(), ssm_state_indices=jnp.zeros((4, 1, 1), jnp.int32)),
     ValueError, r"ssm_state_indices: expected shape \[N\] or \[N, C\]"),
    (lambda q, k, v, g, b: dict(ssm_state_indices=jnp.asarray([0, 1, 2, 3])), ValueError,
     "ssm_state_indices: needs the state pool"),
    (lambda q, k, v, g, b: dict(inplace_final_state=True), ValueError,
     "initial_state: required with inplace_final_state=True"),
    (lambda q, k, v, g, b: dict(initial_state=_pool5(), ssm_state_indices=jnp.arange(4),
                                num_accepted_tokens=jnp.ones(4, jnp.int32)), ValueError,
     r"num_accepted_tokens needs 2-D ssm_state_indices \[N, C\]"),
    (lambda q, k, v, g, b: dict(num_accepted_tokens=jnp.ones(4, jnp.int32)), ValueError,
     "num_accepted_tokens needs 2-D ssm_state_indices"),
    # 2-D slots and accepted counts by value (the slots a sequence reads or writes: column 0 here, one token).
    (lambda q, k, v, g, b: dict(initial_state=_pool5(), ssm_state_indices=_slots([0, 1], [2, 3], [5, 4], [-1, 9])),
     ValueError,
     r"ssm_state_indices\[2, 0\] = 5 is out of range for num_states = 5 \(use a negative index for padding\)"),
    (lambda q, k, v, g, b: dict(initial_state=_pool5(), ssm_state_indices=_slots([0, 1], [0, 3], [2, 4], [-1, 9])),
     ValueError, "state slot 0 is used by sequences 0 and 1 of ssm_state_indices"),
    (lambda q, k, v, g, b: dict(initial_state=_pool5(), ssm_state_indices=_slots([0, 1], [2, 3], [4, -1], [-1, 9]),
                                num_accepted_tokens=jnp.asarray([1, 2, 3, 1])), ValueError,
     r"num_accepted_tokens\[2\] = 3 must be in \[1, 2\] \(the columns of ssm_state_indices\)"),
    (lambda q, k, v, g, b: dict(initial_state=_pool5(), ssm_state_indices=_slots([0, 1], [2, 3], [4, -1], [-1, 9]),
                                num_accepted_tokens=jnp.asarray([0, 1, 1, 1])), ValueError,
     r"num_accepted_tokens\[0\] = 0 must be in \[1, 2\]"),
    (lambda q, k, v, g, b: dict(out=jnp.zeros((4, 1, 2, 8))), ValueError, r"o: expected shape \[B, T, HV, V\]"),
    (lambda q, k, v, g, b: dict(beta=jnp.zeros((4, 1, 2, 8))), ValueError,
     r"beta: expected shape \[B, T, HV\] or \[B, T, HV, V\]"),
    (lambda q, k, v, g, b: dict(lower_bound="x"), TypeError, "lower_bound must be a Python float"),
    (lambda q, k, v, g, b: dict(bar=2), TypeError, r"fused_recurrent_kda\(\) got an unexpected keyword argument 'bar'"),
    (lambda q, k, v, g, b: dict(allow_neg_eigval=True), ValueError,
     "allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
]


@pytest.mark.parametrize("make,exc,match", BAD_RECURRENT)
def test_recurrent_bad_arguments(make, exc, match, backend):
    q, k, v, g, b = _random(np.random.default_rng(0), 4, 1, 2, 16)
    args = dict(q=q, k=k, v=v, g=g, beta=b)
    args.update(make(q, k, v, g, b))
    with _expect(exc, match):
        kj.fused_recurrent_kda(**args, kernel=backend)


# --- every option of fla's API: FFI and naive kernels under jax.jit against kda's numpy entries ------------
#
# The FFI kernels are the numpy entries' kernels: their results must be identical. The naive kernels are an
# independent fp32 recurrence: the fp32 rule. Shapes are small (H = 2, HV = 4, K != V off the vector width).


def _problem(seed, B=2, T=11, H=2, HV=4, K=12, V=20, beta_per_value=False, logits=False, raw_gate=False):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    q, k = f(B, T, H, K), f(B, T, H, K)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # a contracting delta rule: the fp32 rule holds
    v = f(B, T, HV, V)
    g = f(B, T, HV, K) * 2 if raw_gate else -np.exp(f(B, T, HV, K) - 2)
    bshape = (B, T, HV, V) if beta_per_value else (B, T, HV)
    beta = f(*bshape) if logits else rng.uniform(0, 1, bshape).astype(np.float32)
    params = dict(A_log=f(HV) * 0.5, dt_bias=f(HV * K) * 0.5)
    return [q, k, v, g, beta], params, rng


def _jitted_call(entry, arrays: dict, static: dict, backend):
    """entry under jax.jit: the arrays traced, the other arguments static."""
    names = sorted(arrays)

    @jax.jit
    def run(*xs):
        return entry(**dict(zip(names, xs)), **static, kernel=backend)

    return run(*(jnp.asarray(arrays[n]) for n in names))


def _compare(got, want, backend, what):
    if got is None or want is None:
        assert got is None and want is None, what
        return
    got = np.asarray(got)
    if backend == "ffi":
        np.testing.assert_array_equal(got, want, err_msg=what)
    elif got.ndim == 5 or "state" in what:
        check_state(got, want, what=what)
    else:
        check_f32(got, want, what=what)


# (options, what they need): "gate" a raw g and A_log / dt_bias, "logits" beta logits, "cu" packed sequences
# with an empty one, "pool" state_indices with padding.
CHUNK_OPTIONS = [
    dict(),
    dict(use_qk_l2norm_in_kernel=True, scale=0.3, initial_state=True, output_final_state=True),
    dict(use_beta_sigmoid_in_kernel=True, logits=True, output_final_state=True),
    dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, logits=True, output_final_state=True),
    dict(use_gate_in_kernel=True, gate=("A_log", "dt_bias"), output_final_state=True),
    dict(use_gate_in_kernel=True, gate=("A_log",), lower_bound=-3.0, safe_gate=True, output_final_state=True),
    dict(use_gate_in_kernel=True, gate=("dt_bias",), lower_bound=-2.0, output_final_state=True),
    dict(state_v_first=True, initial_state=True, output_final_state=True, chunk_size=32),
    dict(cu=True, initial_state=True, output_final_state=True),
    dict(cu=True, pool=True, state_v_first=True, use_qk_l2norm_in_kernel=True),
]


def _chunk_case(opts, seed):
    opts = dict(opts)
    gate = opts.pop("gate", ())
    logits = opts.pop("logits", False)
    cu, pool, init = opts.pop("cu", False), opts.pop("pool", False), opts.pop("initial_state", False)
    B, T = (1, 23) if cu else (2, 11)
    arrays, params, rng = _problem(seed, B=B, T=T, logits=logits, raw_gate=bool(gate))
    arrays = dict(zip(("q", "k", "v", "g", "beta"), arrays))
    arrays.update({n: params[n] for n in gate})
    N = 4 if cu else B
    if cu:
        arrays["cu_seqlens"] = np.array([0, 7, 7, 20, 23], np.int32)
    state_dims = (20, 12) if opts.get("state_v_first") else (12, 20)
    if pool:
        arrays["initial_state"] = rng.standard_normal((6, 4, *state_dims)).astype(np.float32)
        arrays["state_indices"] = np.array([5, -1, 0, 2], np.int32)
    elif init:
        arrays["initial_state"] = rng.standard_normal((N, 4, *state_dims)).astype(np.float32)
    return arrays, opts


@pytest.mark.parametrize("i", range(len(CHUNK_OPTIONS)))
def test_chunk_options_match_numpy(i, backend):
    import kda

    arrays, static = _chunk_case(CHUNK_OPTIONS[i], seed=10 + i)
    want_arrays = {n: np.array(x) for n, x in arrays.items()}
    want = kda.chunk_kda(**want_arrays, **static)
    if "state_indices" in arrays:  # the numpy entry updates the pool in place; kda.jax returns it
        want = (want[0], want_arrays["initial_state"])
    got = _jitted_call(kj.chunk_kda, arrays, static, backend)
    assert len(got) == 2
    _compare(got[0], want[0], backend, f"{CHUNK_OPTIONS[i]}: o")
    _compare(got[1], want[1], backend, f"{CHUNK_OPTIONS[i]}: state")


RECURRENT_OPTIONS = [
    # fla's public entry: [B, T] rows of several tokens, contiguous states.
    dict(entry="public", initial_state=True, output_final_state=True, use_qk_l2norm_in_kernel=True),
    dict(entry="public", beta_per_value=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, logits=True,
         output_final_state=True),
    dict(entry="public", cu=True, use_gate_in_kernel=True, gate=("A_log", "dt_bias"), state_v_first=True,
         initial_state=True, output_final_state=True),
    dict(entry="public", use_gate_in_kernel=True, gate=("A_log", "dt_bias"), lower_bound=-1.5, output_final_state=True),
    # vLLM's entry: in place into [N, HV, K, V], 1-D and 2-D slots, accepted counts, padding, a state per token.
    dict(entry="fwd", initial_state=True, scale=0.5),
    dict(entry="fwd", cu=True, idx="1d", state_v_first=True),
    dict(entry="fwd", cu=True, idx="2d", accepted=True, beta_per_value=True),
    dict(entry="fwd", cu=True, idx="2d", accepted=True, inplace_final_state=False, output_final_state=True,
         state_v_first=True),
    dict(entry="fwd", cu=True, idx="1d", inplace_final_state=False, output_final_state=True, out=True),
    # [N, 1]: one slot per sequence, as 1-D indices, with accepted counts of 1.
    dict(entry="fwd", cu=True, idx="2d1", accepted=True),
]


def _recurrent_case(opts, seed):
    opts = dict(opts)
    entry = kj.fused_recurrent_kda if opts.pop("entry") == "public" else kj.fused_recurrent_kda_fwd
    gate, logits = opts.pop("gate", ()), opts.pop("logits", False)
    cu, idx, accepted = opts.pop("cu", False), opts.pop("idx", None), opts.pop("accepted", False)
    init, out = opts.pop("initial_state", False), opts.pop("out", False)
    B, T = (1, 7) if cu else (3, 4)
    arrays, params, rng = _problem(seed, B=B, T=T, logits=logits, raw_gate=bool(gate),
                                   beta_per_value=opts.pop("beta_per_value", False))
    arrays = dict(zip(("q", "k", "v", "g", "beta"), arrays))
    arrays.update({n: params[n] for n in gate})
    N = 3 if cu else B
    if cu:
        arrays["cu_seqlens"] = np.array([0, 3, 5, 7], np.int32)
    state_dims = (20, 12) if opts.get("state_v_first") else (12, 20)
    if idx is not None:
        arrays["initial_state"] = rng.standard_normal((8, 4, *state_dims)).astype(np.float32)
        if idx == "1d":
            arrays["ssm_state_indices"] = np.array([6, -1, 1], np.int32)
        elif idx == "2d1":
            arrays["ssm_state_indices"] = np.array([[6], [-1], [1]], np.int32)
            arrays["num_accepted_tokens"] = np.ones(3, np.int32)
        else:
            arrays["ssm_state_indices"] = np.array([[0, 1, 2], [3, 4, -1], [-1, 5, 6]], np.int32)
            if accepted:  # sequence 2 reads slot [2, 0] = -1: padding
                arrays["num_accepted_tokens"] = np.array([2, 1, 1], np.int32)
    elif init:
        arrays["initial_state"] = rng.standard_normal((N, 4, *state_dims)).astype(np.float32)
    if out:
        arrays["out"] = np.full((B, T, 4, 20), np.nan, np.float32)
    return entry, arrays, opts


@pytest.mark.parametrize("i", range(len(RECURRENT_OPTIONS)))
def test_recurrent_options_match_numpy(i, backend):
    import kda

    entry, arrays, static = _recurrent_case(RECURRENT_OPTIONS[i], seed=30 + i)
    np_entry = getattr(kda, entry.__name__)
    want_arrays = {n: np.array(x) for n, x in arrays.items()}
    want = np_entry(**want_arrays, **static)
    got = _jitted_call(entry, arrays, static, backend)
    _compare(got[0], want[0], backend, f"{RECURRENT_OPTIONS[i]}: o")
    _compare(got[1], want[1], backend, f"{RECURRENT_OPTIONS[i]}: states")
    pool_in = arrays.get("initial_state")
    if pool_in is not None and pool_in.shape[0] == 8 and static.get("inplace_final_state", True):
        # The updated pool is returned; slot 7, which no sequence touches, is unchanged.
        np.testing.assert_array_equal(np.asarray(got[1])[7], pool_in[7])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_matches_numpy(dtype, backend):
    """bf16 / fp16 operands: the same cast points as the numpy entries (inputs as given, fp32 inside, o
    rounded once): the FFI kernels identical, the naive ones within the fp32 rule plus one rounding of o."""
    import kda

    arrays, params, _ = _problem(50, B=1, T=13, raw_gate=True)
    half = [np.asarray(jnp.asarray(x).astype(dtype)) for x in arrays]
    kw = dict(use_gate_in_kernel=True, A_log=params["A_log"], dt_bias=params["dt_bias"], output_final_state=True)
    for name in ("chunk_kda", "fused_recurrent_kda"):
        want_o, want_s = getattr(kda, name)(*half, **kw)
        o, s = getattr(kj, name)(*(jnp.asarray(x) for x in half), **kw, kernel=backend)
        assert o.dtype == dtype and s.dtype == jnp.float32
        if backend == "ffi":
            np.testing.assert_array_equal(np.asarray(o).astype(np.float32), want_o.astype(np.float32))
            np.testing.assert_array_equal(s, want_s)
            continue
        a, r = np.asarray(o, np.float64), np.asarray(want_o, np.float64)
        m = np.maximum(np.abs(a), np.abs(r))
        ulp = np.spacing(m.astype(np.float16)).astype(np.float64) if dtype == jnp.float16 else ulp_bf16(m)
        tol = 1e-5 + 1e-5 * np.abs(r) + ulp
        assert (np.abs(a - r) <= tol).all(), f"{name} {dtype} o: max err/tol {np.max(np.abs(a - r) / tol)}"
        check_state(s, want_s, what=f"{name} {dtype} state")


def test_recurrent_out_is_donated_and_returned(backend):
    arrays, _, _ = _problem(60, B=2, T=3)
    q, k, v, g, beta = (jnp.asarray(x) for x in arrays)
    out = jnp.zeros(v.shape, v.dtype)
    ptr = out.unsafe_buffer_pointer()
    o, s = kj.fused_recurrent_kda_fwd(q, k, v, g, beta, out=out, inplace_final_state=False, kernel=backend)
    assert s is None and out.is_deleted()
    if backend == "ffi":  # aliased to the custom call's result
        assert o.unsafe_buffer_pointer() == ptr
    want, _ = kj.fused_recurrent_kda(q, k, v, g, beta, kernel=backend)
    np.testing.assert_array_equal(o, want)


def test_speculative_pool_in_place_under_jit_with_donation(backend):
    """2-D slots and accepted counts in a jitted step that donates the pool: updated in place."""
    entry, arrays, static = _recurrent_case(RECURRENT_OPTIONS[6], seed=36)
    arrays = {n: jnp.asarray(x) for n, x in arrays.items()}
    pool = arrays.pop("initial_state")
    expect_o, expect_pool = kj.fused_recurrent_kda_fwd(**arrays, initial_state=jnp.array(pool), kernel="naive")
    step = jax.jit(lambda pool, a: kj.fused_recurrent_kda_fwd(**a, initial_state=pool, kernel=backend),
                   donate_argnums=0)
    p = jnp.array(pool)
    ptr = p.unsafe_buffer_pointer()
    o, new = step(p, arrays)
    assert p.is_deleted() and new.unsafe_buffer_pointer() == ptr
    check_f32(o, expect_o, what="o")
    check_state(new, expect_pool, what="pool")


# --- return_intermediate_states --------------------------------------------------------------------------


def test_intermediate_states_are_the_states_at_chunk_starts(backend):
    """h[0, first chunk of n + j] is sequence n's state after j * chunk_size tokens: the final state of the
    numpy chunk_kda over that prefix, and the numpy entry's h. Under jax.jit with a traced cu_seqlens, from
    the static num_chunks; in the pool form, padding rows are zeros."""
    import kda

    arrays, _, rng = _problem(70, B=1, T=80, K=8, V=12)
    q, k, v, g, beta = arrays
    cu = np.array([0, 33, 33, 65, 80], np.int32)  # 2 + 0 + 1 + 1 chunks of 32
    init = rng.standard_normal((4, 4, 12, 8)).astype(np.float32)  # V-first
    kw = dict(chunk_size=32, state_v_first=True, use_qk_l2norm_in_kernel=True)
    run = jax.jit(lambda *a: kj.chunk_kda(*a[:5], initial_state=a[6], cu_seqlens=a[5], output_final_state=True,
                                          return_intermediate_states=True, num_chunks=4, kernel=backend, **kw))
    o, final, h = run(*(jnp.asarray(x) for x in (q, k, v, g, beta, cu, init)))
    assert h.shape == (1, 4, 4, 12, 8) and h.dtype == jnp.float32
    want = kda.chunk_kda(q, k, v, g, beta, initial_state=init, cu_seqlens=cu, output_final_state=True,
                         return_intermediate_states=True, **kw)
    for got, w, what in zip((o, final, h), want, ("o", "final state", "h")):
        _compare(got, w, backend, what)
    chunk = 0
    for n in range(4):
        bos, eos = int(cu[n]), int(cu[n + 1])
        for j in range(-(-(eos - bos) // 32)):
            if j == 0:
                want_h = init[n]
            else:
                sl = slice(bos, bos + 32 * j)
                _, s = kda.chunk_kda(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=init[n:n + 1],
                                     output_final_state=True, **kw)
                want_h = s[0]
            check_state(h[0, chunk], want_h, what=f"sequence {n} chunk {j}")
            chunk += 1
    # The pool form (as the numpy entry's); a padding sequence's rows are zeros.
    pool = rng.standard_normal((5, 4, 12, 8)).astype(np.float32)
    idx = np.array([3, 1, -1, 0], np.int32)
    _, _, hp = kj.chunk_kda(*(jnp.asarray(x) for x in arrays), initial_state=jnp.asarray(pool),
                            cu_seqlens=jnp.asarray(cu), state_indices=jnp.asarray(idx),
                            return_intermediate_states=True, kernel=backend, **kw)
    _, _, want_hp = kda.chunk_kda(*arrays, initial_state=pool.copy(), cu_seqlens=cu, state_indices=idx,
                                  return_intermediate_states=True, **kw)
    _compare(hp, want_hp, backend, "pool h")
    check_state(hp[0, 0], pool[3], what="pool chunk 0")
    assert not np.asarray(hp[0, 2]).any()
    # Rows without cu_seqlens: [B, NT]; bf16 operands give bf16 states (k's dtype).
    qb, kb, vb = (jnp.asarray(x.reshape(2, 40, *x.shape[2:])).astype(jnp.bfloat16) for x in (q, k, v))
    o2, _, h2 = kj.chunk_kda(qb, kb, vb, jnp.asarray(g.reshape(2, 40, 4, 8)), jnp.asarray(beta.reshape(2, 40, 4)),
                             return_intermediate_states=True, kernel=backend)
    assert h2.shape == (2, 1, 4, 8, 12) and h2.dtype == jnp.bfloat16
    assert not np.asarray(h2, np.float32).any()  # the state before the first token: zeros


def test_intermediate_states_refusals(backend):
    arrays, _, _ = _problem(71, B=1, T=10)
    q, k, v, g, beta = (jnp.asarray(x) for x in arrays)
    cu = jnp.asarray([0, 4, 10], jnp.int32)
    with pytest.raises(ValueError, match="traced cu_seqlens needs num_chunks="):
        jax.jit(lambda cu: kj.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, return_intermediate_states=True,
                                        kernel=backend))(cu)
    with pytest.raises(ValueError, match="num_chunks must be the number of chunks, 2, got 3"):
        kj.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, return_intermediate_states=True, num_chunks=3, kernel=backend)
    with pytest.raises(ValueError, match="return_intermediate_states must be used with disable_recompute=False"):
        kj.chunk_kda(q, k, v, g, beta, return_intermediate_states=True, disable_recompute=True, kernel=backend)
    # A wrong static count under jit: refused when the call runs (the FFI kernel's shape check of h; the naive
    # kernels' check of the values).
    run = jax.jit(lambda cu: kj.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, return_intermediate_states=True,
                                          num_chunks=3, kernel=backend))
    bad = "intermediate_states" if backend == "ffi" else "num_chunks must be the number of chunks, 2, got 3"
    with pytest.raises(jax.errors.JaxRuntimeError, match=bad):
        jax.block_until_ready(run(cu))


def test_intermediate_states_sized_by_cu_seqlens_cpu_under_jit(backend):
    """fla's cu_seqlens_cpu (concrete, host values) gives the static num_chunks of a traced cu_seqlens; given
    with a concrete cu_seqlens it must hold its values."""
    arrays, _, _ = _problem(72, B=1, T=70)
    q, k, v, g, beta = (jnp.asarray(x) for x in arrays)
    cu_host = np.array([0, 5, 40, 70], np.int32)  # 1 + 2 + 1 chunks of 32
    run = jax.jit(lambda cu: kj.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cu_host,
                                          return_intermediate_states=True, chunk_size=32, kernel=backend))
    o, _, h = run(jnp.asarray(cu_host))
    want = kj.chunk_kda(q, k, v, g, beta, cu_seqlens=cu_host, return_intermediate_states=True, chunk_size=32,
                        num_chunks=4, kernel=backend)
    assert h.shape == (1, 4) + want[2].shape[2:]
    np.testing.assert_array_equal(o, want[0])
    np.testing.assert_array_equal(h, want[2])
    assert np.asarray(h[0, 2]).any()
    with pytest.raises(ValueError, match=r"cu_seqlens_cpu: must hold cu_seqlens' values: cu_seqlens_cpu\[2\] = 41"):
        kj.chunk_kda(q, k, v, g, beta, cu_seqlens=jnp.asarray(cu_host), cu_seqlens_cpu=[0, 5, 41, 70],
                     return_intermediate_states=True, kernel=backend)
    # A host copy whose count (3) disagrees with the traced values (4): refused when the call runs.
    bad = jax.jit(lambda cu: kj.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=[0, 70, 70, 70],
                                          return_intermediate_states=True, chunk_size=32, kernel=backend))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match="intermediate_states" if backend == "ffi" else "num_chunks must be the number of chunks"):
        jax.block_until_ready(bad(jnp.asarray(cu_host)))


# --- fused_kda_gate ---------------------------------------------------------------------------------


@pytest.mark.parametrize("form", [dict(), dict(lower_bound=-2.0), dict(lower_bound=-1.0, A_log=None)])
def test_fused_kda_gate_matches_numpy(form):
    import kda

    rng = np.random.default_rng(80)
    g = (rng.standard_normal((3, 5, 4, 6)) * 15).astype(np.float32)  # both softplus branches
    kw = dict(A_log=rng.standard_normal(4).astype(np.float32), dt_bias=rng.standard_normal(24).astype(np.float32))
    kw.update(form)
    want = kda.fused_kda_gate(g, **kw)
    got = jax.jit(lambda g: kj.fused_kda_gate(g, **kw))(jnp.asarray(g))
    assert got.dtype == jnp.float32 and got.shape == g.shape
    check_f32(got, want, what=str(form))
    assert kj.fused_kda_gate(jnp.asarray(g), **kw, output_dtype=jnp.bfloat16).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="A_log is required when lower_bound is not set"):
        kj.fused_kda_gate(g)
    with pytest.raises(ValueError, match=r"dt_bias: expected HV\*K = 24 elements"):
        kj.fused_kda_gate(g, A_log=np.zeros(4, np.float32), dt_bias=np.zeros(5, np.float32))


def test_index_values_checked_at_run_time_under_jit(backend):
    """Under jit cu_seqlens, the indices and the accepted counts are traced: both backends refuse a bad value
    when the call runs, with the messages of an eager call (the FFI kernels themselves, the naive ones by the
    core's check of the values in a host callback), instead of returning a wrong result."""
    q, k, v, g, b = _ok(T=4)
    run = jax.jit(lambda cu: kj.chunk_kda(q, k, v, g, b, cu_seqlens=cu, kernel=backend))
    bad = r"chunk_kda: cu_seqlens must be non-decreasing, but cu_seqlens\[2\] = 2 < cu_seqlens\[1\] = 3"
    with pytest.raises(jax.errors.JaxRuntimeError, match=bad):
        jax.block_until_ready(run(jnp.asarray([0, 3, 2, 4], jnp.int32)))
    chunk_pool = jax.jit(lambda pool, idx: kj.chunk_kda(q, k, v, g, b, initial_state=pool, state_indices=idx,
                                                         kernel=backend))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"state_indices\[0\] = 3 is out of range for num_states = 3"):
        jax.block_until_ready(chunk_pool(jnp.zeros((3, 2, 16, 16)), jnp.asarray([3], jnp.int32)))

    dq, dk, dv, dg, db = _random(np.random.default_rng(0), 2, 1, 2, 16)
    pool = jnp.zeros((3, 2, 16, 16))
    step = jax.jit(lambda pool, idx: kj.fused_recurrent_kda_fwd(dq, dk, dv, dg, db, initial_state=pool,
                                                                ssm_state_indices=idx, kernel=backend))
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"duplicate state index 1 in ssm_state_indices\[0\] and ssm_state_indices\[1\]"):
        jax.block_until_ready(step(pool, jnp.asarray([1, 1], jnp.int32)))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"ssm_state_indices\[1\] = 3 is out of range"):
        jax.block_until_ready(step(pool, jnp.asarray([0, 3], jnp.int32)))
    # 2-D slots, with and without accepted counts.
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=r"ssm_state_indices\[1, 0\] = 3 is out of range for num_states = 3"):
        jax.block_until_ready(step(pool, jnp.asarray([[0, 1], [3, 2]], jnp.int32)))
    verify = jax.jit(lambda pool, idx, acc: kj.fused_recurrent_kda_fwd(
        dq, dk, dv, dg, db, initial_state=pool, ssm_state_indices=idx, num_accepted_tokens=acc, kernel=backend))
    idx = jnp.asarray([[0, 1], [2, -1]], jnp.int32)
    for acc, bad in (([1, 3], r"num_accepted_tokens\[1\] = 3 must be in \[1, 2\] \(the columns of ssm_state_"),
                     ([0, 1], r"num_accepted_tokens\[0\] = 0 must be in \[1, 2\]")):
        with pytest.raises(jax.errors.JaxRuntimeError, match=bad):
            jax.block_until_ready(verify(pool, idx, jnp.asarray(acc, jnp.int32)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="state slot 0 is used by sequences 0 and 1"):
        jax.block_until_ready(verify(pool, jnp.asarray([[0, 1], [2, 0]], jnp.int32), jnp.asarray([1, 2], jnp.int32)))
    # Good values pass the check: the eager call's results.
    acc = jnp.asarray([2, 1], jnp.int32)
    o, new = verify(jnp.ones((3, 2, 16, 16)), idx, acc)
    want_o, want_new = kj.fused_recurrent_kda_fwd(dq, dk, dv, dg, db, initial_state=jnp.ones((3, 2, 16, 16)),
                                                  ssm_state_indices=idx, num_accepted_tokens=acc, kernel=backend)
    _compare(o, np.asarray(want_o), backend, "o")
    _compare(new, np.asarray(want_new), backend, "state pool")


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
    ffi_or_skip()
    env = {k: v for k, v in os.environ.items() if k != kffi.ENV_LIBRARY}
    code = "import kda, kda.jax as kj; print(kj.backend(), kj.ffi.library_path(), kda.__file__)"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    backend_name, lib, init = r.stdout.split()
    assert backend_name == "ffi"
    assert Path(lib) == Path(init).parent / kffi.LIBRARY_NAME


def test_ffi_kernels_follow_the_settings_of_the_kda_module():
    """One libkda in the process: kda.set_kernel_isa chooses the variant the FFI kernels run too."""
    ffi_or_skip()
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
