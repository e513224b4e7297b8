"""What fla-core 0.6.0 takes beyond one dtype, in every front end (numpy, torch, JAX) and every KDA and Gated
DeltaNet entry: q, k and v each in its own float dtype (fla's tests pass float32 q, k with float16 v), and
float16 / bfloat16 initial states (but chunk_kda's, which fla asserts float32). Each tensor is read in its own
dtype and the math is fp32, as fla's: the results equal, bit for bit, the float32 call on the widened values,
with o rounded once into fla's dtype (q's for the chunk entries, v's for the recurrent ones) and a narrow pool
updated in place holding the fp32 states rounded to nearest even."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kda

BF16, F16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
B, T, H, HV, K, V = 1, 9, 2, 4, 16, 8
CU = np.array([0, 4, 9], np.int64)  # two packed sequences


def problem(gdn: bool, seed: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    g_shape = (B, T, HV) if gdn else (B, T, HV, K)
    return dict(q=rng.standard_normal((B, T, H, K)).astype(F32) * 0.3,
                k=rng.standard_normal((B, T, H, K)).astype(F32) * 0.3,
                v=rng.standard_normal((B, T, HV, V)).astype(F32),
                g=-np.abs(rng.standard_normal(g_shape)).astype(F32) * 0.2,
                beta=rng.uniform(0.1, 0.9, (B, T, HV)).astype(F32))


def rounded(x: np.ndarray, dt) -> np.ndarray:
    """x rounded to dt and back to float32 (what a dt tensor holds)."""
    return np.asarray(x, dt).astype(F32)


class Numpy:
    name = "numpy"
    api = kda

    @staticmethod
    def arr(x):
        return np.array(x, copy=True)  # a copy: the pool entries update their argument in place

    @staticmethod
    def np(x):
        return np.asarray(x)


class Torch:
    name = "torch"

    def __init__(self):
        torch = pytest.importorskip("torch")
        import kda.torch as kt

        self.torch, self.api = torch, kt

    def arr(self, x):
        x = np.ascontiguousarray(x)
        if x.dtype == BF16:
            return self.torch.from_numpy(x.astype(F32)).to(self.torch.bfloat16)
        return self.torch.from_numpy(x)

    def np(self, x):
        if x.dtype == self.torch.bfloat16:
            return x.float().numpy().astype(BF16)
        return x.numpy()


class Jax:
    name = "jax"

    def __init__(self):
        pytest.importorskip("jax")
        import jax.numpy as jnp

        import kda.jax as kj

        self.jnp, self.api = jnp, kj

    def arr(self, x):
        return self.jnp.asarray(x)

    def np(self, x):
        return np.asarray(x)


class JaxNaive(Jax):
    """kda.jax's pure-JAX kernels (the fallback without the XLA FFI library)."""
    name = "jax-naive"


FRONTS = {"numpy": Numpy, "torch": Torch, "jax": Jax, "jax-naive": JaxNaive}
MIXED = [(F32, F32, F16), (BF16, F32, F16), (F16, BF16, BF16)]  # q, k, v


@pytest.fixture(params=list(FRONTS))
def front(request):
    f = FRONTS[request.param]()
    if request.param != "jax-naive":
        yield f
        return
    before = f.api.get_backend_setting()
    f.api.set_backend("naive")
    try:
        yield f
    finally:
        f.api.set_backend(before)


def entries(api, gdn: bool):
    if gdn:
        return api.chunk_gated_delta_rule, api.fused_recurrent_gated_delta_rule
    return api.chunk_kda, api.fused_recurrent_kda


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: "-".join(np.dtype(t).name for t in d))
def test_token_tensors_in_their_own_dtypes(front, gdn, dtypes):
    p = problem(gdn)
    h0 = np.random.default_rng(5).standard_normal((2, HV, K, V)).astype(F32) * 0.1
    narrow = dict(p, q=p["q"].astype(dtypes[0]), k=p["k"].astype(dtypes[1]), v=p["v"].astype(dtypes[2]))
    wide = dict(p, q=rounded(p["q"], dtypes[0]), k=rounded(p["k"], dtypes[1]), v=rounded(p["v"], dtypes[2]))
    for entry, o_dtype in zip(entries(front.api, gdn), (dtypes[0], dtypes[2])):  # chunk: q's dtype; recurrent: v's
        def run(t):
            args = {n: front.arr(x) for n, x in t.items()}
            o, s = entry(**args, initial_state=front.arr(h0), output_final_state=True, cu_seqlens=front.arr(CU))
            return front.np(o), front.np(s)

        o, s = run(narrow)
        want_o, want_s = run(wide)
        assert o.dtype == o_dtype and s.dtype == F32, (entry.__name__, o.dtype, s.dtype)
        np.testing.assert_array_equal(o.astype(F32), rounded(want_o, o_dtype), err_msg=entry.__name__)
        np.testing.assert_array_equal(s, want_s, err_msg=entry.__name__)


@pytest.mark.parametrize("state_dtype", [BF16, F16], ids=["bf16", "f16"])
def test_narrow_initial_states(front, state_dtype):
    for gdn in (False, True):
        p = {n: front.arr(x.astype(BF16)) for n, x in problem(gdn).items()}
        h0 = np.random.default_rng(6).standard_normal((2, HV, K, V)).astype(state_dtype)
        chunk, recurrent = entries(front.api, gdn)
        for entry in (chunk, recurrent) if gdn else (recurrent,):
            o, s = entry(**p, initial_state=front.arr(h0), output_final_state=True, cu_seqlens=front.arr(CU))
            want_o, want_s = entry(**p, initial_state=front.arr(h0.astype(F32)), output_final_state=True,
                                   cu_seqlens=front.arr(CU))
            np.testing.assert_array_equal(front.np(o).astype(F32), front.np(want_o).astype(F32))
            assert front.np(s).dtype == F32  # fla's final states are float32
            np.testing.assert_array_equal(front.np(s), front.np(want_s))
        if not gdn:  # fla's chunk_kda asserts a float32 initial state
            with pytest.raises(TypeError, match="initial_state: dtype must be float32"):
                chunk(**p, initial_state=front.arr(h0), output_final_state=True, cu_seqlens=front.arr(CU))


@pytest.mark.parametrize("gdn", [False, True], ids=["kda", "gdn"])
def test_a_narrow_pool_is_updated_in_place_rounded(front, gdn):
    # vLLM's _fwd entries: the pool [S, HV, K, V] in bfloat16, each sequence's slot read and written back.
    p = problem(gdn)
    fwd = front.api.fused_recurrent_gated_delta_rule_fwd if gdn else front.api.fused_recurrent_kda_fwd
    pool0 = (np.random.default_rng(7).standard_normal((5, HV, K, V)) * 0.1).astype(BF16)
    idx = np.array([3, 1], np.int32)
    args = {n: front.arr(x) for n, x in p.items()}

    def run(pool):
        o, s = fwd(**args, initial_state=pool, cu_seqlens=front.arr(CU), ssm_state_indices=front.arr(idx),
                   inplace_final_state=True)
        return front.np(o), front.np(s)

    o, pool = run(front.arr(pool0))
    want_o, want_pool = run(front.arr(pool0.astype(F32)))
    assert pool.dtype == BF16
    np.testing.assert_array_equal(o, want_o)
    np.testing.assert_array_equal(pool, want_pool.astype(BF16))
    np.testing.assert_array_equal(pool[[0, 2, 4]], pool0[[0, 2, 4]])  # the slots no sequence reads
