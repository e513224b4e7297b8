"""The numpy API's contract: bad arguments refused with ValueError / TypeError naming the argument
and the expected shape or dtype, before anything is written; outputs that alias what they should;
torch and JAX arrays read in place; thread and kernel switches."""

import ml_dtypes
import numpy as np
import pytest

import kda
from golden import check_f32, check_state_f32, golden_set_dir, load_case
from kda import _core
from kda._arrays import for_core

H, K = 2, 16


def problem(B=1, T=5, N=None, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K)).astype(dtype)
    k = rng.standard_normal((B, T, H, K)).astype(dtype)
    v = rng.standard_normal((B, T, H, K)).astype(dtype)
    g = -np.abs(rng.standard_normal((B, T, H, K))).astype(np.float32) * 0.1
    beta = rng.uniform(0, 1, (B, T, H)).astype(np.float32)
    return q, k, v, g, beta


def run_refused(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)


# --- bad arguments --------------------------------------------------------------------------------

@pytest.mark.parametrize("mutate,exc,match", [
    (lambda a: a.update(q=a["q"][0]), ValueError, r"q: expected a 4-D array \[B, T, H, K\]"),
    (lambda a: a.update(k=a["k"][:, :, :1]), ValueError, r"k: expected shape \[B, T, H, K\].*= \[1, 5, 2, 16\]"),
    (lambda a: a.update(v=a["v"][:, :4]), ValueError, r"v: expected shape \[B, T, HV, V\]"),
    (lambda a: a.update(g=a["g"][..., :8]), ValueError, r"g: expected shape"),
    (lambda a: a.update(beta=a["beta"][..., None]), ValueError, r"beta: expected shape \[B, T, HV\]"),
    (lambda a: a.update(q=a["q"].astype(np.float64)), TypeError, r"q: dtype must be float32, bfloat16 or float16, got float64"),
    (lambda a: a.update(g=a["g"].astype(np.float64)), TypeError, r"g: dtype must be float32, bfloat16 or float16"),
    (lambda a: a.update(v=a["v"].astype(np.int16)), TypeError, r"v: dtype must be float32, bfloat16 or float16"),
    # q, k, v of any layout are read in place or copied (test_fla_api.py); g and beta must be C-contiguous.
    (lambda a: a.update(g=np.asfortranarray(a["g"])), ValueError, r"g: must be C-contiguous"),
    (lambda a: a.update(beta=a["beta"][:, :, ::-1]), ValueError, r"beta: must be C-contiguous"),
    (lambda a: a.update(q=[1.0, 2.0]), TypeError, r"q: expected an array"),
    (lambda a: a.update(beta=a["beta"].astype(np.uint16)), TypeError, r"beta: dtype must be float32, bfloat16 or float16, got uint16"),
    (lambda a: a.update(scale=-1.0), ValueError, r"scale: must be a finite number > 0"),
    (lambda a: a.update(kernel="fast"), ValueError, r"kernel"),
    (lambda a: a.update(cu_seqlens=np.array([0, 3, 2, 5])), ValueError, r"cu_seqlens must be non-decreasing"),
    (lambda a: a.update(cu_seqlens=np.array([0, 4])), ValueError, r"cu_seqlens\[N\] must equal T"),
    (lambda a: a.update(cu_seqlens=np.array([1, 5])), ValueError, r"cu_seqlens\[0\] must be 0"),
    (lambda a: a.update(cu_seqlens=np.array([0.0, 5.0])), TypeError, r"cu_seqlens: dtype must be an integer"),
    (lambda a: a.update(cu_seqlens=np.array([0])), ValueError, r"cu_seqlens: expected shape \[N \+ 1\]"),
    (lambda a: a.update(initial_state=np.zeros((2, H, K, K), np.float32)), ValueError,
     r"initial_state: expected shape \[N, HV, K, V\] = \[1, 2, 16, 16\]"),
    (lambda a: a.update(initial_state=np.zeros((1, H, K, K), np.float64)), TypeError,
     r"initial_state: dtype must be float32"),
    (lambda a: a.update(use_gate_in_kernel=True), ValueError, r"A_log: required with use_gate_in_kernel"),
    (lambda a: a.update(use_gate_in_kernel=True, A_log=np.zeros(3)), ValueError, r"A_log: expected HV = 2"),
    (lambda a: a.update(use_gate_in_kernel=True, A_log=np.zeros(H), dt_bias=np.zeros(5)), ValueError,
     r"dt_bias: expected HV\*K = 32"),
    (lambda a: a.update(allow_neg_eigval=True), ValueError, r"allow_neg_eigval=True requires use_beta_sigmoid_in_kernel"),
    (lambda a: a.update(chunk_size=16), ValueError, r"`chunk_size` must be either 32 or 64 for KDA, got 16"),
    (lambda a: a.update(use_gate_in_kernel=True, safe_gate=True, A_log=np.zeros(H)), ValueError,
     r"lower_bound must be specified when safe_gate=True"),
    (lambda a: a.update(use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0), ValueError,
     r"lower_bound must be in the safe range \[-5, 0\), got -6"),
    (lambda a: a.update(lower_bound=1.0), ValueError, r"lower_bound: must be a finite number <= 0"),
])
def test_chunk_kda_refuses(mutate, exc, match):
    q, k, v, g, beta = problem()
    a = dict(q=q, k=k, v=v, g=g, beta=beta, output_final_state=True)
    mutate(a)
    run_refused(exc, match, kda.chunk_kda, **a)


def test_head_dim_and_heads_refused_by_the_kernel_check():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 2, 300)).astype(np.float32)
    run_refused(ValueError, r"the key head dim K must be in \[1, 256\], got 300", kda.chunk_kda, x, x, x, -np.abs(x),
                np.ones((1, 3, 2), np.float32))
    y = rng.standard_normal((1, 3, 3, 16)).astype(np.float32)
    qk = rng.standard_normal((1, 3, 2, 16)).astype(np.float32)
    run_refused(ValueError, r"the value heads HV = 3 must be a multiple of the query/key heads H = 2", kda.chunk_kda,
                qk, qk, y, -np.abs(y), np.ones((1, 3, 3), np.float32))


def pool_problem(S=4, N=3):
    q, k, v, g, beta = problem(B=N, T=1, seed=2)
    pool = np.random.default_rng(3).standard_normal((S, H, K, K)).astype(np.float32)
    return (q, k, v, g, beta), pool


@pytest.mark.parametrize("idx,match", [
    ([0, 4, 1], r"state_indices\[1\] = 4 is out of range for num_states = 4"),
    ([2, 1, 2], r"duplicate state index 2"),
    ([0, 1], r"state_indices: expected shape \[N\] = \[3\]"),
])
def test_pool_index_errors_write_nothing(idx, match):
    (q, k, v, g, beta), pool = pool_problem()
    before = pool.copy()
    with pytest.raises(ValueError, match=match.replace("state_indices", "(ssm_)?state_indices")):
        kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=np.array(idx))
    np.testing.assert_array_equal(pool, before)
    # The same through chunk_kda's pool form (one token per sequence, packed).
    pk = [x.reshape(1, 3, *x.shape[2:]) for x in (q, k, v, g, beta)]
    with pytest.raises(ValueError, match=match):
        kda.chunk_kda(*pk, initial_state=pool, cu_seqlens=np.arange(4), state_indices=np.array(idx),
                      output_final_state=True)
    np.testing.assert_array_equal(pool, before)


def test_pool_must_be_writable_float32():
    (q, k, v, g, beta), pool = pool_problem()
    ro = pool.copy()
    ro.flags.writeable = False
    idx = np.arange(3)
    run_refused(ValueError, r"initial_state: is read-only", kda.fused_recurrent_kda_fwd, q, k, v, g, beta,
                initial_state=ro, ssm_state_indices=idx)
    run_refused(TypeError, r"initial_state: dtype must be float32", kda.fused_recurrent_kda_fwd, q, k, v, g, beta,
                initial_state=pool.astype(np.float64), ssm_state_indices=idx)
    run_refused(ValueError, r"initial_state: expected shape \[S, HV, K, V\]", kda.fused_recurrent_kda_fwd, q, k, v, g,
                beta, initial_state=pool[:, :1].copy(), ssm_state_indices=idx)
    # fla's public entry reads a contiguous initial state (read-only is fine) and returns a new final state.
    o, s = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=ro[:3], output_final_state=True)
    assert s.shape == (3, H, K, K) and not np.shares_memory(s, ro)


def test_fused_recurrent_several_tokens_per_sequence():
    # Any number of tokens per sequence, rows or packed: the chunked prefill's result.
    q, k, v, g, beta = problem(B=1, T=5)
    for cu in (None, np.array([0, 2, 5]), np.array([0, 0, 5])):
        want_o, want_s = kda.chunk_kda(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
        o, s = kda.fused_recurrent_kda(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
        np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(s, want_s, rtol=1e-5, atol=1e-5)
    run_refused(ValueError, r"cu_seqlens\[N\] must equal T, got 3 with T = 5", kda.fused_recurrent_kda, q, k, v, g,
                beta, cu_seqlens=np.array([0, 2, 3]))
    run_refused(ValueError, r"ssm_state_indices: needs the state pool", kda.fused_recurrent_kda, q, k, v, g, beta,
                cu_seqlens=np.array([0, 2, 5]), ssm_state_indices=np.arange(2))


def test_layer_and_engine_refuse_bad_input():
    path = golden_set_dir("kda-mini")
    d = load_case("kda-mini", "varlen_initstate")
    L = kda.KimiDeltaAttention.from_pretrained(path, layer=0, dtype="float32")
    x = d["hidden_states"]
    run_refused(ValueError, r"hidden_states: expected shape \[T, hidden\] = \[64, 512\]", L.forward, x[:, :500])
    run_refused(TypeError, r"hidden_states: dtype must be float32, got bfloat16", L.forward, x.astype(ml_dtypes.bfloat16))
    run_refused(ValueError, r"cu_seqlens\[N\] must equal T = 64", L.forward, x, np.array([0, 10]))
    run_refused(ValueError, r"initial_recurrent_state: expected shape \[N, HV, K, V\] = \[1, 4, 128, 128\]", L.forward,
                x, None, np.zeros((2, 4, 128, 128), np.float32))
    run_refused(ValueError, r"initial_conv_state: expected shape \[N, W-1, C\] = \[1, 3, 1536\]", L.forward, x, None,
                None, np.zeros((1, 4, 1536), np.float32))
    run_refused(ValueError, r"layer 3|KDA layer", kda.KimiDeltaAttention.from_pretrained, path, layer=3)
    run_refused(ValueError, r"bfloat17|dtype", kda.KimiDeltaAttention.from_pretrained, path, layer=0, dtype="bfloat17")
    run_refused(ValueError, r"config.json|No such|cannot", kda.KimiDeltaAttention.from_pretrained, "/nonexistent", layer=0)
    run_refused(ValueError, r"max_running 0 needs a known number of requests or a state budget", kda.Engine, path,
                max_running=0)
    run_refused(ValueError, r"max_running must be >= 0", kda.Engine, path, max_running=-1)
    run_refused(ValueError, r"snapshot_interval must be a positive multiple of 64", kda.Engine, path,
                snapshot_interval=100)
    run_refused(ValueError, r"prefix_cache_bytes must be >= 0", kda.Engine, path, prefix_cache_bytes=-1)
    eng = kda.Engine(path, max_running=2, dtype="float32")
    run_refused(ValueError, r"hidden_states: a request needs at least one token", eng.submit, x[:0])
    run_refused(ValueError, r"initial_recurrent_state: expected shape \[L, HV, K, V\] = \[3, 4, 128, 128\]", eng.submit,
                x, initial_recurrent_state=np.zeros((1, 4, 128, 128), np.float32))
    rid = eng.submit(x[:5], request_id=7)
    run_refused(ValueError, r"7", eng.submit, x[:5], request_id=7)  # duplicate id
    assert list(eng.run()) == [rid]


def test_empty_batches():
    z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    o, s = kda.chunk_kda(z(1, 0, H, K), z(1, 0, H, K), z(1, 0, H, K), z(1, 0, H, K), z(1, 0, H),
                         initial_state=np.ones((1, H, K, K), np.float32), output_final_state=True)
    assert o.shape == (1, 0, H, K) and (s == 1).all()  # no token: the state passes through
    run_refused(ValueError, r"q: chunk_kda needs at least one sequence", kda.chunk_kda, z(0, 5, H, K), z(0, 5, H, K),
                z(0, 5, H, K), z(0, 5, H, K), z(0, 5, H))
    pool = np.ones((3, H, K, K), np.float32)
    o, s = kda.fused_recurrent_kda_fwd(z(0, 1, H, K), z(0, 1, H, K), z(0, 1, H, K), z(0, 1, H, K), z(0, 1, H),
                                       initial_state=pool, ssm_state_indices=np.zeros(0, np.int32))
    assert o.shape == (0, 1, H, K) and s is pool and (pool == 1).all()
    run_refused(ValueError, r"ssm_state_indices: expected shape \[N\] or \[N, C\] \(a slot per token\), got \[2, 1, 1\]",
                kda.fused_recurrent_kda_fwd, z(2, 1, H, K), z(2, 1, H, K), z(2, 1, H, K), z(2, 1, H, K), z(2, 1, H),
                initial_state=pool, ssm_state_indices=np.array([[[0]], [[1]]]))
    run_refused(ValueError, r"state_indices: values out of the range of int32", kda.chunk_kda, z(1, 3, H, K),
                z(1, 3, H, K), z(1, 3, H, K), z(1, 3, H, K), z(1, 3, H), initial_state=pool, state_indices=[2**40])


# --- zero copy and aliasing -----------------------------------------------------------------------

def test_numpy_bf16_crosses_as_a_view():
    x = np.zeros((3, 4), ml_dtypes.bfloat16)
    assert np.shares_memory(for_core(x, "x"), x)
    y = np.zeros((3, 4), np.float32)
    assert for_core(y, "y") is y


def test_read_only_inputs_are_read_in_place():
    xs = list(problem(T=4, seed=9))
    want, _ = kda.chunk_kda(*xs)
    xs[:3] = [x.astype(ml_dtypes.bfloat16) for x in xs[:3]]
    want_bf, _ = kda.chunk_kda(*xs)
    for x in xs:
        x.flags.writeable = False
    got_bf, _ = kda.chunk_kda(*xs)
    np.testing.assert_array_equal(got_bf.view(np.uint16), want_bf.view(np.uint16))
    f32 = [x.astype(np.float32) for x in xs]
    for x in f32:
        x.flags.writeable = False
    assert want.shape == kda.chunk_kda(*f32)[0].shape


def test_contiguous_final_state_may_alias_nothing_and_pool_is_updated_in_place():
    q, k, v, g, beta = problem(T=6)
    init = np.random.default_rng(5).standard_normal((1, H, K, K)).astype(np.float32)
    init_before = init.copy()
    o, s = kda.chunk_kda(q, k, v, g, beta, initial_state=init, output_final_state=True)
    np.testing.assert_array_equal(init, init_before)  # the contiguous form reads initial_state only
    assert not np.shares_memory(s, init)
    # Pool form: the returned final state is the pool, written in place.
    pool = np.concatenate([np.zeros_like(init), init])
    o2, s2 = kda.chunk_kda(q, k, v, g, beta, initial_state=pool, output_final_state=True, state_indices=[1])
    assert s2 is pool
    np.testing.assert_array_equal(o2, o)
    np.testing.assert_array_equal(pool[1], s[0])
    np.testing.assert_array_equal(pool[0], 0)


def test_core_writes_into_the_given_output():
    # The low-level entry point writes o and final_state where the caller put them.
    q, k, v, g, beta = problem(T=4)
    o = np.full((1, 4, H, K), np.nan, np.float32)
    fs = np.full((1, H, K, K), np.nan, np.float32)
    o_ptr, fs_ptr = o.ctypes.data, fs.ctypes.data
    args = dict(q=q, k=k, v=v, g=g, beta=beta, scale=None, initial_state=None, output_final_state=True,
                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, cu_seqlens=np.array([0, 4]), A_log=None,
                dt_bias=None, state=None, state_indices=None)
    sizes = _core.chunk_kda(o=None, final_state=None, check_only=True, **args)
    assert sizes == dict(B=1, T=4, N=1, H=H, HV=H, K=K, V=K, num_states=0, num_chunks=1, scalar_gate=False)
    assert np.isnan(o).all()  # a check writes nothing
    assert _core.chunk_kda(o=o, final_state=fs, **args) is None
    assert o.ctypes.data == o_ptr and fs.ctypes.data == fs_ptr
    want_o, want_s = kda.chunk_kda(q, k, v, g, beta, output_final_state=True)
    np.testing.assert_array_equal(o, want_o)
    np.testing.assert_array_equal(fs, want_s)


def test_batched_without_cu_seqlens_equals_packed():
    q, k, v, g, beta = problem(B=3, T=5, seed=7)
    o, s = kda.chunk_kda(q, k, v, g, beta, output_final_state=True, kernel="reference")
    pk = [x.reshape(1, 15, *x.shape[2:]) for x in (q, k, v, g, beta)]
    o2, s2 = kda.chunk_kda(*pk, output_final_state=True, cu_seqlens=np.array([0, 5, 10, 15]), kernel="reference")
    np.testing.assert_array_equal(o.reshape(o2.shape), o2)
    np.testing.assert_array_equal(s, s2)


def test_jax_arrays_are_read():
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    q, k, v, g, beta = problem(T=6, seed=11)
    want, want_s = kda.chunk_kda(q, k, v, g, beta, output_final_state=True)
    got, got_s = kda.chunk_kda(*(jnp.asarray(x) for x in (q, k, v, g, beta)), output_final_state=True)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_s, want_s)
    qb = jnp.asarray(q, dtype=jnp.bfloat16)
    o_b, _ = kda.chunk_kda(qb, jnp.asarray(k, dtype=jnp.bfloat16), jnp.asarray(v, dtype=jnp.bfloat16), g, beta)
    assert o_b.dtype == ml_dtypes.bfloat16
    o_n, _ = kda.chunk_kda(np.asarray(qb), k.astype(ml_dtypes.bfloat16), v.astype(ml_dtypes.bfloat16), g, beta)
    np.testing.assert_array_equal(o_b.view(np.uint16), o_n.view(np.uint16))
    (qs, ks, vs, gs, bs), pool = pool_problem()
    with pytest.raises(TypeError, match="JAX arrays are immutable"):
        kda.fused_recurrent_kda_fwd(qs, ks, vs, gs, bs, initial_state=jnp.asarray(pool), ssm_state_indices=[0, 1, 2])


def test_torch_tensors_in_torch_out_in_place():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    (q, k, v, g, beta), pool = pool_problem(S=5, N=3)
    want_pool = pool.copy()
    want_o, _ = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=want_pool, ssm_state_indices=[4, -1, 0])
    tp = torch.from_numpy(pool.copy())
    ptr = tp.data_ptr()
    o, s = kda.fused_recurrent_kda(*(torch.from_numpy(x) for x in (q, k, v, g, beta)), initial_state=tp,
                                   ssm_state_indices=torch.tensor([4, -1, 0]))
    assert isinstance(o, torch.Tensor) and s is tp and tp.data_ptr() == ptr
    np.testing.assert_array_equal(o.numpy(), want_o)
    np.testing.assert_array_equal(tp.numpy(), want_pool)
    # bf16 tensors, the pool only read: the state after each token comes back in a new buffer [B * T, ...]
    # (padding rows unwritten).
    qb = torch.from_numpy(q).to(torch.bfloat16)
    before = pool.copy()
    ob, sb = kda.fused_recurrent_kda(qb, torch.from_numpy(k).bfloat16(), torch.from_numpy(v).bfloat16(),
                                     torch.from_numpy(g), torch.from_numpy(beta), inplace_final_state=False,
                                     output_final_state=True, initial_state=torch.from_numpy(pool),
                                     ssm_state_indices=[4, -1, 0])
    assert ob.dtype == torch.bfloat16 and sb.shape == (3, H, K, K) and not ob[1].float().any()
    np.testing.assert_array_equal(pool, before)
    # kda is forward-only: the chunk entry refuses a tensor that requires grad under grad mode and reads it under
    # no_grad; the recurrent entries (no backward in fla either) read it and return results without a graph.
    qg = torch.from_numpy(q).requires_grad_()
    ins = [torch.from_numpy(x) for x in (k, v, g, beta)]
    with pytest.raises(RuntimeError, match="q requires grad, but kda is forward-only"):
        kda.chunk_kda(qg, *ins)
    with torch.no_grad():
        kda.chunk_kda(qg, *ins)
    og, sg = kda.fused_recurrent_kda(qg, *ins, output_final_state=True)
    assert not og.requires_grad and not sg.requires_grad
    np.testing.assert_array_equal(og.numpy(), kda.fused_recurrent_kda(q, k, v, g, beta)[0])


def test_threads_and_kernel_switches():
    n = kda.get_num_threads()
    try:
        kda.set_num_threads(1)
        assert kda.get_num_threads() == 1
        q, k, v, g, beta = problem(T=9)
        o1, s1 = kda.chunk_kda(q, k, v, g, beta, output_final_state=True)
        kda.set_num_threads(2)
        o2, s2 = kda.chunk_kda(q, k, v, g, beta, output_final_state=True)
        np.testing.assert_array_equal(o1, o2)  # independent of the thread count
    finally:
        kda.set_num_threads(n)
    with pytest.raises(ValueError, match="n must be >= 1"):
        kda.set_num_threads(0)
    assert kda.active_kernel("reference") == "reference"
    assert kda.active_kernel().startswith("optimized/")
    with pytest.raises(ValueError):
        kda.set_kernel_isa("sse9")
    kda.set_kernel_isa("generic")
    try:
        assert kda.active_kernel() == "optimized/generic"
    finally:
        kda.set_kernel_isa("auto")


def assert_releases_gil(fn):
    """fn runs while another Python thread keeps running (it could not while fn held the GIL)."""
    import threading
    import time

    ticks = []
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=counter)
    t.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    stop.set()
    t.join()
    during = [x for x in ticks if t0 < x < t1]
    assert t1 - t0 > 0.02, "too short to tell"
    assert len(during) >= 5, f"the other thread ran {len(during)} times in {t1 - t0:.3f} s"


def test_engine_prefix_cache_reuses_a_shared_prompt():
    """An engine with a prefix cache starts a request whose token ids extend an earlier one's from that
    request's snapshot: the rows after it equal the engine without a cache, the rows before are reused."""
    path = golden_set_dir("kda-mini")
    x = load_case("kda-mini", "single_T1024")["hidden_states"][:300]
    ids = (np.arange(300) % 1000).astype(np.int32)
    plain = kda.Engine(path, max_running=2, prefill_chunk=64, dtype="float32")
    cached = kda.Engine(path, max_running=2, prefill_chunk=64, dtype="float32", prefix_cache_bytes=256 << 20,
                        snapshot_interval=64)
    got = {}
    for name, eng in (("plain", plain), ("cached", cached)):
        eng.submit(x[:200], decode_tokens=4, request_id=0, token_ids=ids[:200])
        first = eng.run()[0]
        eng.submit(x, decode_tokens=4, request_id=1, token_ids=ids)
        got[name] = (first, eng.run()[1])
    assert got["plain"][1].cached_tokens == 0
    assert got["cached"][0].cached_tokens == 0
    assert got["cached"][1].cached_tokens == 200  # the snapshot request 0 left at its end
    check_f32(got["cached"][1].out[200:], got["plain"][1].out[200:], what="rows after the reused prefix")
    check_state_f32(got["cached"][1].final_recurrent_state, got["plain"][1].final_recurrent_state,
                    what="final state")
    # Max running 0: as many requests as the state budget holds.
    assert kda.Engine(path, max_running=0, dtype="float32", state_budget_bytes=cached.pool_bytes).pool_capacity == 2
    run_refused(ValueError, r"token_ids: expected shape \[T\] = \[300\]", cached.submit, x, token_ids=ids[:10])


def test_gil_released_while_computing():
    path = golden_set_dir("kda-mini")
    d = load_case("kda-mini", "single_T1024")
    x = d["hidden_states"]
    L = kda.KimiDeltaAttention.from_pretrained(path, layer=0, dtype="float32", kernel="reference")
    assert_releases_gil(lambda: L.forward(x))
    eng = kda.Engine(path, max_running=2, prefill_chunk=256, dtype="float32", kernel="reference")
    eng.submit(x)
    assert_releases_gil(eng.run)
    q, k, v = (d[n][None] for n in ("q_conv", "k_conv", "v_conv"))
    assert_releases_gil(lambda: kda.chunk_kda(q, k, v, d["g"][None], d["beta"][None], kernel="reference"))
