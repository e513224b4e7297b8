"""kda.jax's mamba_chunk_scan_combined and selective_state_update (Mamba2's SSD scan with mamba_ssm's names):
the XLA FFI kernels and the pure-JAX naive kernels, eager and under jax.jit, against the float64 per-token
reference of mamba_ssm's semantics (mamba_ref.py) at design §5's fp32 rule, and against kda.mamba_ssm's
numpy front end bit for bit where the same kernel runs on the same operands (no softplus or z gate, whose
exp and log1p jax.numpy rounds its own way; under jit, as the decode step always runs, no D, whose y + D x
XLA may fuse into one rounding); packed sequences
(cu_seqlens concrete or traced, seq_idx), initial, final and varlen states, the pool with padding, the
state donated; bad arguments refused by name. The chunked scan's shared refusals run in
test_mamba_ssm.py over this front end too."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kda.jax as kj
import kda.mamba_ssm as ms
from golden import check_f32, check_state_f32
from jax_util import backend, ffi_or_skip  # noqa: F401 (backend: a fixture)
from mamba_ref import inputs, ref_scan, ref_step

SCAN = ("x", "dt", "A", "B", "C")


def jx(kw: dict) -> dict:
    return {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}


def scan_args(a: dict) -> list:
    return [a[n] for n in SCAN]


# --- mamba_chunk_scan_combined -----------------------------------------------------------------------------


@pytest.mark.parametrize("D", [None, "D", "D2"])
def test_chunk_scan_equals_numpy_bit_for_bit(D):
    ffi_or_skip()
    a = inputs(seed=11)
    kw = dict(D=None if D is None else a[D], dt_bias=a["dt_bias"], initial_states=a["init"], dt_limit=(0.01, 0.8),
              return_final_states=True)
    ref = ms.mamba_chunk_scan_combined(*scan_args(a), 64, **kw)
    got = kj.mamba_chunk_scan_combined(*map(jnp.asarray, scan_args(a)), 64, **jx(kw), kernel="ffi")
    assert isinstance(got[0], jax.Array) and got[0].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got[0]), ref[0])
    np.testing.assert_array_equal(np.asarray(got[1]), ref[1])


def test_chunk_scan_bf16_equals_numpy_bit_for_bit():
    ffi_or_skip()
    a = inputs(seed=12)
    bf = {k: a[k].astype(jnp.bfloat16) for k in ("x", "B", "C")}
    ref = ms.mamba_chunk_scan_combined(bf["x"], a["dt"], a["A"], bf["B"], bf["C"], 64, D=a["D"], dt_bias=a["dt_bias"])
    got = kj.mamba_chunk_scan_combined(jnp.asarray(bf["x"]), jnp.asarray(a["dt"]), jnp.asarray(a["A"]),
                                       jnp.asarray(bf["B"]), jnp.asarray(bf["C"]), 64, D=jnp.asarray(a["D"]),
                                       dt_bias=jnp.asarray(a["dt_bias"]), kernel="ffi")
    assert got.dtype == jnp.bfloat16  # one rounding of the float32 result, as numpy's
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), ref.view(np.uint16))


def test_chunk_scan_jitted_equals_numpy_bit_for_bit():
    ffi_or_skip()
    a = inputs(seed=13)
    ref = ms.mamba_chunk_scan_combined(*scan_args(a), 64, dt_bias=a["dt_bias"], initial_states=a["init"],
                                       return_final_states=True)
    f = jax.jit(lambda x, dt, A, B, C, bias, init: kj.mamba_chunk_scan_combined(
        x, dt, A, B, C, 64, dt_bias=bias, initial_states=init, return_final_states=True, kernel="ffi"))
    got = f(*map(jnp.asarray, scan_args(a)), jnp.asarray(a["dt_bias"]), jnp.asarray(a["init"]))
    np.testing.assert_array_equal(np.asarray(got[0]), ref[0])
    np.testing.assert_array_equal(np.asarray(got[1]), ref[1])


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("D, gated", [(None, False), ("D", True), ("D2", True)])
def test_chunk_scan_matches_the_reference(backend, D, gated, jit):
    a = inputs()
    d = None if D is None else a[D]
    z = a["z"] if gated else None
    limit = (0.05, 0.6)

    def scan(x, dt, A, B, C, D, z, bias, init):
        return kj.mamba_chunk_scan_combined(x, dt, A, B, C, 256, D=D, z=z, dt_bias=bias, initial_states=init,
                                            dt_softplus=True, dt_limit=limit, return_final_states=True,
                                            kernel=backend)

    fn = jax.jit(scan) if jit else scan
    out, final = fn(*map(jnp.asarray, scan_args(a)), *(None if v is None else jnp.asarray(v) for v in (d, z)),
                    jnp.asarray(a["dt_bias"]), jnp.asarray(a["init"]))
    for r in range(2):
        y, st = ref_scan(a["x"][r], a["dt"][r], a["A"], a["B"][r], a["C"][r], d, None if z is None else z[r],
                         a["dt_bias"], a["init"][r], True, limit)
        check_f32(np.asarray(out[r]), y, what=f"row {r} out")
        check_state_f32(np.asarray(final[r]), st[-1], what=f"row {r} final")


@pytest.mark.parametrize("form", ["cu_seqlens", "seq_idx", "both", "traced cu_seqlens"])
def test_packed_sequences(backend, form):
    a = inputs(b=1, L=50, seed=1)
    cu = np.array([0, 7, 7, 30, 50], np.int32)
    seq_idx = np.repeat(np.arange(4), np.diff(cu))[None]
    varlen = form != "seq_idx"

    def scan(x, dt, A, B, C, D, bias, init, cu_seqlens):
        return kj.mamba_chunk_scan_combined(
            x, dt, A, B, C, 16, D=D, dt_bias=bias, initial_states=init, dt_softplus=True, return_final_states=True,
            return_varlen_states=varlen, cu_seqlens=cu_seqlens,
            seq_idx=seq_idx if form in ("seq_idx", "both") else None, kernel=backend)

    args = [*map(jnp.asarray, scan_args(a)), jnp.asarray(a["D"]), jnp.asarray(a["dt_bias"]),
            jnp.asarray(a["init"][:1]), None if form == "seq_idx" else jnp.asarray(cu)]
    res = jax.jit(scan)(*args) if form == "traced cu_seqlens" else scan(*args)
    y, st = ref_scan(a["x"][0], a["dt"][0], a["A"], a["B"][0], a["C"][0], a["D"], None, a["dt_bias"], a["init"][0],
                     True, starts=(7, 30))
    check_f32(np.asarray(res[0][0]), y, what="out")
    check_state_f32(np.asarray(res[1][0]), st[-1], what="final")
    if varlen:
        v = np.asarray(res[2])
        assert v.shape == (4, 4, 8, 16)
        check_state_f32(v[0], st[6], what="sequence 0 (from the initial state)")
        np.testing.assert_array_equal(v[1], 0)  # an empty sequence: zeros
        check_state_f32(v[2], st[29], what="sequence 2")
        check_state_f32(v[3], st[49], what="sequence 3")


def test_seq_idx_over_several_rows(backend):
    a = inputs(b=2, L=20, seed=2)
    seq_idx = np.array([[0] * 5 + [1] * 15, [0] * 12 + [3] * 8])
    out, final = kj.mamba_chunk_scan_combined(*map(jnp.asarray, scan_args(a)), 8, initial_states=a["init"],
                                              seq_idx=seq_idx, dt_softplus=True, return_final_states=True,
                                              kernel=backend)
    for r, cut in enumerate((5, 12)):
        y, st = ref_scan(a["x"][r], a["dt"][r], a["A"], a["B"][r], a["C"][r], state=a["init"][r], softplus_dt=True,
                         starts=(cut,))
        check_f32(np.asarray(out[r]), y, what=f"row {r}")
        check_state_f32(np.asarray(final[r]), st[-1], what=f"row {r} final")


def test_traced_cu_seqlens_with_bad_values_fails_the_call(backend):
    a = inputs(b=1, L=9, seed=3)
    f = jax.jit(lambda cu: kj.mamba_chunk_scan_combined(*map(jnp.asarray, scan_args(a)), 64, cu_seqlens=cu,
                                                        kernel=backend))
    with pytest.raises(jax.errors.JaxRuntimeError, match="cu_seqlens"):
        jax.block_until_ready(f(jnp.array([0, 4, 8], jnp.int32)))  # ends at 8, not seqlen = 9


@pytest.mark.parametrize("what, match", [
    ("seq_idx", "seq_idx: must be concrete"),
    ("both", "seq_idx: cannot be checked against a traced cu_seqlens"),
    ("float cu_seqlens", "cu_seqlens: dtype must be an integer type"),
    ("cu_seqlens rows", "cu_seqlens: packed sequences need batch 1"),
])
def test_chunk_refusals_under_jit(what, match):
    a = inputs(b=2 if what == "cu_seqlens rows" else 1, L=9, seed=4)
    seq = np.zeros((1, 9), np.int32)
    cu = np.array([0, 9], np.float32 if what == "float cu_seqlens" else np.int32)

    def scan(traced):  # seq_idx traced, or cu_seqlens traced (with "both" beside a concrete seq_idx)
        return kj.mamba_chunk_scan_combined(*map(jnp.asarray, scan_args(a)), 64,
                                            seq_idx=traced if what == "seq_idx" else seq if what == "both" else None,
                                            cu_seqlens=None if what == "seq_idx" else traced)

    with pytest.raises((ValueError, TypeError), match=match):
        jax.jit(scan)(seq if what == "seq_idx" else cu)


# --- selective_state_update --------------------------------------------------------------------------------


def step_inputs(b=3, H=4, P=8, G=2, N=16, seed=5, tied=True):
    """A decode step as numpy arrays: dt, A, D, dt_bias expanded from one value per head (transformers'
    form), or with ``tied=False`` values per channel (and A per state dimension); and a start state."""
    a = inputs(b=b, L=1, H=H, P=P, G=G, N=N, seed=seed)
    e = lambda v, shape: np.ascontiguousarray(np.broadcast_to(v, shape))  # noqa: E731
    kw = dict(x=a["x"][:, 0], dt=e(a["dt"][:, 0, :, None], (b, H, P)), A=e(a["A"][:, None, None], (H, P, N)),
              B=a["B"][:, 0], C=a["C"][:, 0], D=e(a["D"][:, None], (H, P)), dt_bias=e(a["dt_bias"][:, None], (H, P)),
              z=a["z"][:, 0])
    if not tied:
        r = np.random.default_rng(seed + 100)
        kw.update(dt=r.standard_normal((b, H, P)).astype(np.float32), A=-r.random((H, P, N)).astype(np.float32),
                  dt_bias=(r.standard_normal((H, P)) * 0.3).astype(np.float32))
    return kw, a["init"]


@pytest.mark.parametrize("tied", [True, False])
def test_state_update_equals_numpy_bit_for_bit(tied):
    ffi_or_skip()
    kw, init = step_inputs(tied=tied)
    del kw["z"], kw["D"]  # the step runs jitted: y + D x may fuse
    state = init.copy()
    ref = ms.selective_state_update(state, **kw)
    out, new = kj.selective_state_update(jnp.asarray(init), **jx(kw), kernel="ffi")
    np.testing.assert_array_equal(np.asarray(out), ref)
    np.testing.assert_array_equal(np.asarray(new), state)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("tied", [True, False])
def test_state_update_matches_the_reference(backend, tied, jit):
    kw, init = step_inputs(tied=tied)
    y, s = ref_step(init, **kw, softplus_dt=True)

    def step(state, kw):
        return kj.selective_state_update(state, **kw, dt_softplus=True, kernel=backend)

    out, new = (jax.jit(step) if jit else step)(jnp.asarray(init), jx(kw))
    assert out.shape == kw["x"].shape and new.shape == init.shape
    check_f32(np.asarray(out), y, what="out")
    check_state_f32(np.asarray(new), s, what="state")


@pytest.mark.parametrize("jit", [False, True])
def test_state_update_pool_padding_and_donation(backend, jit):
    kw, _ = step_inputs(b=2)
    pool = np.random.default_rng(8).standard_normal((5, 4, 8, 16)).astype(np.float32)
    idx = np.array([3, -1], np.int32)
    y, s = ref_step(pool[[3, 3]], **kw, softplus_dt=True)

    def step(state, idx, kw):
        return kj.selective_state_update(state, **kw, dt_softplus=True, state_batch_indices=idx, kernel=backend)

    p = jnp.asarray(pool)
    ptr = p.unsafe_buffer_pointer()
    fn = jax.jit(step, donate_argnums=0) if jit else step  # under jit the indices are traced
    out, new = fn(p, jnp.asarray(idx), jx(kw))
    assert p.is_deleted(), "the state is donated"
    if backend == "ffi":
        assert new.unsafe_buffer_pointer() == ptr, "the kernel wrote into the donated buffer"
    check_f32(np.asarray(out[0]), y[0], what="row 0")
    np.testing.assert_array_equal(np.asarray(out[1]), 0)  # padding: zeros, D x left out too
    new = np.asarray(new)
    check_state_f32(new[3], s[0], what="slot 3")
    for i in (0, 1, 2, 4):
        np.testing.assert_array_equal(new[i], pool[i], err_msg=f"slot {i} touched")


def test_state_update_traced_index_out_of_the_pool_fails_the_call(backend):
    kw, init = step_inputs()
    f = jax.jit(lambda idx: kj.selective_state_update(jnp.asarray(init), **jx(kw), state_batch_indices=idx,
                                                      kernel=backend))
    with pytest.raises(jax.errors.JaxRuntimeError, match="ssm_state_indices"):
        jax.block_until_ready(f(jnp.array([0, 1, 3], jnp.int32)))  # slot 3 of a pool of 3


def test_state_update_without_heads_and_bf16_state():
    ffi_or_skip()
    r = np.random.default_rng(7)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    b, dim, N = 2, 12, 8
    state, x, dt, A, B, C = f(b, dim, N), f(b, dim), f(b, dim), -np.abs(f(dim, N)), f(b, N), f(b, N)
    for dtype in (np.float32, jnp.bfloat16):
        ref_state = state.astype(dtype)
        ref = ms.selective_state_update(ref_state, x, dt, A, B, C)
        out, new = kj.selective_state_update(jnp.asarray(state.astype(dtype)), *map(jnp.asarray, (x, dt, A, B, C)),
                                             kernel="ffi")
        assert out.shape == (b, dim) and new.dtype == dtype
        np.testing.assert_array_equal(np.asarray(out), ref)
        np.testing.assert_array_equal(np.asarray(new).view(np.uint8), ref_state.view(np.uint8))
    y, s = ref_step(state[:, None], x[:, None], dt[:, None], A[None], B[:, None], C[:, None], softplus_dt=True)
    out, new = kj.selective_state_update(jnp.asarray(state), *map(jnp.asarray, (x, dt, A, B, C)), dt_softplus=True)
    check_f32(np.asarray(out), y[:, 0], what="out")
    check_state_f32(np.asarray(new), s[:, 0], what="state")


@pytest.mark.parametrize("change, match", [
    (dict(x=np.zeros((3, 4, 7), np.float32)), "x: expected shape"),
    (dict(dt=np.zeros((3, 4), np.float32)), "dt: expected shape"),
    (dict(A=np.zeros((4, 8), np.float32)), "A: expected shape"),
    (dict(A=np.zeros((4, 8, 16), np.int32)), "A: dtype must be a float type"),
    (dict(B=np.zeros((3, 3, 16), np.float32), C=np.zeros((3, 3, 16), np.float32)), "B: ngroups = 3"),
    (dict(C=np.zeros((3, 2, 15), np.float32)), "C: expected shape"),
    (dict(D=np.zeros(4, np.float32)), "D: expected shape"),
    (dict(dt_bias=np.zeros((4, 7), np.float32)), "dt_bias: expected shape"),
    (dict(z=np.zeros((3, 4), np.float32)), "z: expected shape"),
    (dict(state_batch_indices=np.array([0, 1])), "state_batch_indices: expected 3"),
    (dict(state_batch_indices=np.array([0, 1, 3])), "state_batch_indices: must be < 3"),
    (dict(dt_softplus=jnp.array(True)), "dt_softplus must be a Python bool"),
])
def test_state_update_refusals_name_the_argument_and_consume_nothing(change, match):
    kw, init = step_inputs()
    state = jnp.asarray(init)
    with pytest.raises((ValueError, TypeError), match=match):
        kj.selective_state_update(state, **jx(kw | change))
    assert not state.is_deleted()
    np.testing.assert_array_equal(np.asarray(state), init)
