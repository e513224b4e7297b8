"""The kernels through the numpy API against every golden case (kernel level): q_conv, k_conv, v_conv,
g (or g_raw with the gate in the kernel), beta -> o_kda and the final recurrent state, with the fp32
rules of design §5; both kernels, both implementations, contiguous and pool-indexed states."""

import ml_dtypes
import numpy as np
import pytest

import kda
from golden import (
    check_bf16,
    check_f32,
    check_state_f32,
    golden_cases,
    golden_dir,
    golden_required,
    golden_set_dir,
    load_case,
    read_checkpoint_tensors,
)

CASES = golden_cases()
KERNELS = ["reference", "optimized"]


def test_golden_cases_found():
    if not CASES:
        msg = f"no golden cases under {golden_dir()} (set KDA_GOLDEN_DIR)"
        if golden_required():
            pytest.fail(msg)
        pytest.skip(msg)
    assert len(CASES) >= 15


def _ids(cases):
    return [f"{s}/{c}" for s, c in cases]


class Case:
    def __init__(self, set_name, name):
        d = load_case(set_name, name)
        self.d = d
        self.cu = d["cu_seqlens"].astype(np.int64)
        self.N = self.cu.size - 1
        self.T, self.H, self.K = d["q_conv"].shape
        self.init = d.get("initial_recurrent_state")
        self.set_dir = golden_set_dir(set_name)

    def tokens(self, gate="g"):
        d = self.d
        return [d["q_conv"][None], d["k_conv"][None], d["v_conv"][None], d[gate][None], d["beta"][None]]

    def init_or_zeros(self):
        if self.init is not None:
            return self.init.copy()
        return np.zeros((self.N, self.H, self.K, self.K), np.float32)

    def gate_params(self):
        names = ["model.layers.0.self_attn.A_log", "model.layers.0.self_attn.dt_bias"]
        w = read_checkpoint_tensors(self.set_dir, names)
        a_log, dt_bias = (w[n].astype(np.float32).reshape(-1) for n in names)
        return a_log, dt_bias


@pytest.fixture(params=CASES, ids=_ids(CASES))
def case(request):
    return Case(*request.param)


@pytest.mark.parametrize("kernel", KERNELS)
def test_chunk_kda_contiguous_states(case, kernel):
    o, s = kda.chunk_kda(*case.tokens(), scale=case.K**-0.5, initial_state=case.init, output_final_state=True,
                         use_qk_l2norm_in_kernel=True, cu_seqlens=case.cu, kernel=kernel)
    assert o.shape == (1, case.T, case.H, case.K) and o.dtype == np.float32
    assert s.shape == (case.N, case.H, case.K, case.K) and s.dtype == np.float32
    check_f32(o[0], case.d["o_kda"], what="o")
    check_state_f32(s, case.d["final_recurrent_state"], what="final state")
    # Without output_final_state: the same o and no state.
    o2, s2 = kda.chunk_kda(*case.tokens(), initial_state=case.init, use_qk_l2norm_in_kernel=True,
                           cu_seqlens=case.cu, kernel=kernel)
    assert s2 is None
    np.testing.assert_array_equal(o2, o)


@pytest.mark.parametrize("kernel", KERNELS)
def test_chunk_kda_gate_in_kernel(case, kernel):
    a_log, dt_bias = case.gate_params()
    o, s = kda.chunk_kda(*case.tokens("g_raw"), initial_state=case.init, output_final_state=True,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, cu_seqlens=case.cu, A_log=a_log,
                         dt_bias=dt_bias, kernel=kernel)
    check_f32(o[0], case.d["o_kda"], what="o")
    check_state_f32(s, case.d["final_recurrent_state"], what="final state")


@pytest.mark.parametrize("kernel", KERNELS)
def test_chunk_kda_pool_indexed(case, kernel):
    # Sequence n in slot 2n + 1 of a pool with one more slot per sequence; a padding sequence added.
    N, H, K = case.N, case.H, case.K
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((2 * N + 2, H, K, K)).astype(np.float32)
    slots = 2 * np.arange(N, dtype=np.int32) + 1
    pool[slots] = case.init_or_zeros()
    before = pool.copy()
    q, k, v, g, beta = case.tokens()
    cu = np.append(case.cu, case.cu[-1])  # a zero-length padding sequence at the end
    idx = np.append(slots, -1).astype(np.int32)
    o, s = kda.chunk_kda(q, k, v, g, beta, initial_state=pool, output_final_state=True, use_qk_l2norm_in_kernel=True,
                         cu_seqlens=cu, state_indices=idx, kernel=kernel)
    assert s is pool  # the pool itself, updated in place
    check_f32(o[0], case.d["o_kda"], what="o")
    check_state_f32(pool[slots], case.d["final_recurrent_state"], what="pool states")
    untouched = np.setdiff1d(np.arange(pool.shape[0]), slots)
    np.testing.assert_array_equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("kernel", KERNELS)
def test_fused_recurrent_token_by_token(case, kernel):
    # Every sequence decoded token by token through the pool; each step batches one token of every
    # sequence still going, the finished ones as padding (index -1).
    N, H, K = case.N, case.H, case.K
    pool = np.zeros((N + 1, H, K, K), np.float32)
    slots = np.arange(N, dtype=np.int32)[::-1].copy()  # sequence n in slot N - 1 - n
    pool[slots] = case.init_or_zeros()
    lens = np.diff(case.cu)
    o_all = np.zeros((case.T, H, K), np.float32)
    d = case.d
    for t in range(int(lens.max())):
        live = t < lens
        rows = np.where(live, case.cu[:-1] + t, 0)
        idx = np.where(live, slots, -1).astype(np.int32)
        step = [d[n][rows][:, None] for n in ("q_conv", "k_conv", "v_conv", "g", "beta")]
        o, s = kda.fused_recurrent_kda(*step, scale=K**-0.5, initial_state=pool, ssm_state_indices=idx,
                                       use_qk_l2norm_in_kernel=True, kernel=kernel)
        assert s is pool
        assert o.shape == (N, 1, H, K)
        assert not o[~live].any()  # padding: output zero
        o_all[rows[live]] = o[live, 0]
    check_f32(o_all, d["o_kda"], what="o")
    check_state_f32(pool[slots], d["final_recurrent_state"], what="pool states")
    np.testing.assert_array_equal(pool[N], 0)  # the spare slot never written


def test_fused_recurrent_packed_and_not_in_place(case):
    # The first token of every sequence, packed [1, N, ...] with cu_seqlens [0..N], gate in the kernel,
    # inplace_final_state=False, output_final_state=True: the state after every token in a new [N, H, K, V]
    # (one token each; zeros for padding); the pool untouched.
    N, H, K = case.N, case.H, case.K
    d = case.d
    lens = np.diff(case.cu)
    live = lens > 0
    rows = np.where(live, case.cu[:-1], 0)
    pool = case.init_or_zeros()
    before = pool.copy()
    idx = np.where(live, np.arange(N), -1).astype(np.int32)
    step = [d[n][rows][None] for n in ("q_conv", "k_conv", "v_conv", "g_raw", "beta")]
    a_log, dt_bias = case.gate_params()
    o, s = kda.fused_recurrent_kda(*step, initial_state=pool, inplace_final_state=False, output_final_state=True,
                                   cu_seqlens=np.arange(N + 1), ssm_state_indices=idx, use_qk_l2norm_in_kernel=True,
                                   use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias)
    np.testing.assert_array_equal(pool, before)
    assert s.shape == (N, H, K, K) and not np.shares_memory(s, pool)
    # The same step through chunk_kda (one token per sequence) is the reference.
    tok = [x[0][live][None] for x in step]
    cu1 = np.arange(int(live.sum()) + 1)
    o_ref, s_ref = kda.chunk_kda(*tok, initial_state=before[live], output_final_state=True,
                                 use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, cu_seqlens=cu1, A_log=a_log,
                                 dt_bias=dt_bias, kernel="reference")
    check_f32(o[0][live], o_ref[0], what="o")
    check_state_f32(s[live], s_ref, what="states")
    assert not s[~live].any() and not o[0][~live].any()


@pytest.mark.parametrize("kernel", KERNELS)
def test_chunk_kda_bf16_inputs(case, kernel):
    # bf16 q/k/v (numpy ml_dtypes.bfloat16): o is bf16; the bf16 rule against the reference kernel on
    # the same bf16 inputs (r) and the fp32 kernel on their values (x).
    bf = ml_dtypes.bfloat16
    q, k, v, g, beta = case.tokens()
    qb, kb, vb = (x.astype(bf) for x in (q, k, v))
    kw = dict(initial_state=case.init, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=case.cu)
    o, s = kda.chunk_kda(qb, kb, vb, g, beta, kernel=kernel, **kw)
    assert o.dtype == bf and s.dtype == np.float32
    o_r, s_r = kda.chunk_kda(qb, kb, vb, g, beta, kernel="reference", **kw)
    o_x, s_x = kda.chunk_kda(*(x.astype(np.float32) for x in (qb, kb, vb)), g, beta, kernel="reference", **kw)
    check_bf16(o.astype(np.float32), o_r.astype(np.float32), o_x, what="o")
    check_state_f32(s, s_x, what="final state")  # states are fp32 throughout
