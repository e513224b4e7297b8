"""fla's KDA API (fla-core 0.6.0) through kda's entries: signatures, keywords passed through **kwargs,
every option against a float64 recurrence written here (independent of the kernels), numpy and torch."""

import re
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

import kda


def recurrence_f64(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False,
                   use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None,
                   use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False, cu_seqlens=None,
                   chunk_size=None):
    """The KDA recurrence in float64 with fla's options; (o [B, T, HV, V], final states [N, HV, K, V]),
    and with chunk_size fla's h third: the state before every chunk_size-th token of each sequence,
    [B, NT, HV, K, V] (the sequences' chunks one after the other with cu_seqlens, B = 1)."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        seqs = [(0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)]
    o = np.zeros((B, T, HV, V))
    finals = np.zeros((len(seqs), HV, V, K) if state_v_first else (len(seqs), HV, K, V))
    chunks = []  # (b, row) of each sequence's first chunk
    if chunk_size is not None:
        row = 0
        for b, bos, eos in seqs:
            chunks.append((b, 0 if cu_seqlens is None else row))
            row += -(-(eos - bos) // chunk_size)
        nt = -(-T // chunk_size) if cu_seqlens is None else row
        inter = np.zeros((B, nt, *finals.shape[1:]))
    for n, (b, bos, eos) in enumerate(seqs):
        for h in range(HV):
            kh = h // (HV // H)
            S = np.zeros((K, V))
            if initial_state is not None:
                s0 = np.asarray(initial_state[n, h], np.float64)
                S = s0.T.copy() if state_v_first else s0.copy()
            for t in range(bos, eos):
                if chunk_size is not None and (t - bos) % chunk_size == 0:
                    inter[chunks[n][0], chunks[n][1] + (t - bos) // chunk_size, h] = S.T if state_v_first else S
                qt, kt = q[b, t, kh].copy(), k[b, t, kh].copy()
                if use_qk_l2norm_in_kernel:
                    qt /= np.sqrt((qt * qt).sum() + 1e-6)
                    kt /= np.sqrt((kt * kt).sum() + 1e-6)
                gt = g[b, t, h].copy()
                if use_gate_in_kernel:
                    x = gt + (0 if dt_bias is None else np.asarray(dt_bias, np.float64).reshape(HV, K)[h])
                    if lower_bound is not None:
                        a = 1.0 if A_log is None else np.exp(float(A_log[h]))
                        gt = lower_bound / (1 + np.exp(-a * x))
                    else:
                        gt = -np.exp(float(A_log[h])) * np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
                bt = beta[b, t, h]
                if use_beta_sigmoid_in_kernel:
                    bt = (2.0 if allow_neg_eigval else 1.0) / (1 + np.exp(-bt))
                S = S * np.exp(gt)[:, None]
                S = S + np.outer(kt, bt * (v[b, t, h] - kt @ S))
                o[b, t, h] = (scale * qt) @ S
            finals[n, h] = S.T if state_v_first else S
    return (o, finals) if chunk_size is None else (o, finals, inter)


def problem(B=1, T=9, H=2, HV=4, K=12, V=20, seed=0, beta_per_value=False, logits=False):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K)).astype(np.float32)
    k = rng.standard_normal((B, T, H, K)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, HV, V)).astype(np.float32)
    g = (-np.exp(rng.standard_normal((B, T, HV, K)) - 2)).astype(np.float32)
    shape = (B, T, HV, V) if beta_per_value else (B, T, HV)
    beta = (rng.standard_normal(shape) if logits else rng.uniform(0, 1, shape)).astype(np.float32)
    return q, k, v, g, beta


def close(got, want, what):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-5, err_msg=what)


# --- options against the float64 recurrence --------------------------------------------------------

OPTIONS = [
    dict(),
    dict(use_qk_l2norm_in_kernel=True, scale=0.4),
    dict(use_beta_sigmoid_in_kernel=True),
    dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    dict(use_gate_in_kernel=True, gate="softplus"),
    dict(use_gate_in_kernel=True, gate="lower_bound"),
    dict(use_gate_in_kernel=True, gate="lower_bound_no_A"),
    dict(state_v_first=True),
]


def _prepare(opts, rng, HV, K, g):
    opts = dict(opts)
    gate = opts.pop("gate", None)
    if gate is not None:
        g = rng.standard_normal(g.shape).astype(np.float32)
        opts["dt_bias"] = (0.3 * rng.standard_normal(HV * K)).astype(np.float32)
        if gate != "lower_bound_no_A":
            opts["A_log"] = np.log(rng.uniform(1, 5, HV)).astype(np.float32)
        if gate.startswith("lower_bound"):
            opts["lower_bound"] = -4.0
    return opts, g


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
@pytest.mark.parametrize("kernel", ["reference", "optimized"])
def test_chunk_and_recurrent_options_match_float64(opts, kernel):
    rng = np.random.default_rng(1)
    H, HV, K, V = 2, 4, 12, 20
    q, k, v, g, beta = problem(T=11, H=H, HV=HV, K=K, V=V, logits=opts.get("use_beta_sigmoid_in_kernel", False))
    opts, g = _prepare(opts, rng, HV, K, g)
    cu = np.array([0, 4, 4, 11])
    h0 = (0.5 * rng.standard_normal((3, HV, V, K) if opts.get("state_v_first") else (3, HV, K, V))).astype(np.float32)
    want_o, want_s = recurrence_f64(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, **opts)
    for entry in (kda.chunk_kda, kda.fused_recurrent_kda):
        o, s = entry(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, kernel=kernel, **opts)
        close(o, want_o, f"{entry.__name__} o")
        close(s, want_s, f"{entry.__name__} final state")


@pytest.mark.parametrize("dims", [(1, 1, 60, 100), (2, 2, 100, 60), (1, 3, 5, 3), (2, 2, 256, 7)])
def test_head_dims_and_grouped_heads(dims):
    H, HV, K, V = dims
    q, k, v, g, beta = problem(B=2, T=6, H=H, HV=HV, K=K, V=V, seed=2)
    want_o, want_s = recurrence_f64(q, k, v, g, beta)
    for entry in (kda.chunk_kda, kda.fused_recurrent_kda):
        o, s = entry(q, k, v, g, beta, output_final_state=True)
        assert o.shape == (2, 6, HV, V) and s.shape == (2, HV, K, V)
        close(o, want_o, f"{entry.__name__} o")
        close(s, want_s, f"{entry.__name__} state")


def test_beta_per_value_in_the_recurrent_entries():
    q, k, v, g, beta = problem(T=7, seed=3, beta_per_value=True)
    want_o, want_s = [], []
    # A beta per value equals running each value column with its own scalar beta.
    o, s = kda.fused_recurrent_kda(q, k, v, g, beta, output_final_state=True)
    for j in range(v.shape[3]):
        oj, sj = recurrence_f64(q, k, v[..., j:j + 1], g, beta[..., j])
        want_o.append(oj)
        want_s.append(sj)
    close(o, np.concatenate(want_o, axis=-1), "o")
    close(s, np.concatenate(want_s, axis=-1), "state")
    with pytest.raises(ValueError, match=r"beta: expected shape \[B, T, HV\] ="):
        kda.chunk_kda(q, k, v, g, beta)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_precision_inputs(dtype):
    q, k, v, g, beta = problem(T=8, seed=4)
    half = [x.astype(dtype) for x in (q, k, v)]
    o, s = kda.chunk_kda(*half, g.astype(dtype), beta.astype(dtype), output_final_state=True)
    assert o.dtype == np.dtype(dtype)
    # The same arithmetic on the half-precision values, the output rounded once.
    o32, s32 = kda.chunk_kda(*(x.astype(np.float32) for x in half), g.astype(dtype).astype(np.float32),
                             beta.astype(dtype).astype(np.float32), output_final_state=True)
    np.testing.assert_array_equal(o.astype(np.float32), o32.astype(dtype).astype(np.float32))
    np.testing.assert_array_equal(s, s32)


# --- inputs as engines pass them ------------------------------------------------------------------

def fused_slices(q, k, v, pad=3):
    """q, k, v as engines pass them: column slices of one fused projection qkv [B, T, 2*H*K + HV*V + pad]
    (views: strides [T * s, s, dim, 1])."""
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    qkv = np.zeros((B, T, 2 * H * K + HV * V + pad), q.dtype)
    cols = np.cumsum([0, H * K, H * K, HV * V])
    for x, c0, c1 in zip((q, k, v), cols[:-1], cols[1:]):
        qkv[..., c0:c1] = x.reshape(B, T, -1)
    views = tuple(qkv[..., c0:c1].reshape(x.shape) for x, c0, c1 in zip((q, k, v), cols[:-1], cols[1:]))
    assert all(np.shares_memory(x, qkv) and not x.flags.c_contiguous for x in views)
    return views


def same_bits(got, want):
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("kernel", ["reference", "optimized"])
def test_token_strided_qkv_give_the_same_bits(dtype, kernel):
    # q, k, v slices of a fused projection, read in place: the bits of contiguous q, k, v, both kernels, B rows
    # and packed sequences, contiguous states and a pool.
    from kda import _core

    q, k, v, g, beta = problem(B=2, T=9, H=2, HV=4, K=12, V=20, seed=20)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    fused = fused_slices(q, k, v)
    if dtype == np.float32:
        assert all(_core.reads_in_place(x) for x in fused)
    h0 = np.random.default_rng(21).standard_normal((2, 4, 12, 20)).astype(np.float32)
    for entry in (kda.chunk_kda, kda.fused_recurrent_kda):
        want = entry(q, k, v, g, beta, initial_state=h0, output_final_state=True, kernel=kernel)
        got = entry(*fused, g, beta, initial_state=h0, output_final_state=True, kernel=kernel)
        for x, y in zip(got, want):
            same_bits(x, y)
    # Packed: [1, 2 T, ...] with cu_seqlens.
    packed = [x.reshape(1, 18, *x.shape[2:]) for x in (q, k, v, g, beta)]
    cu = np.array([0, 4, 18])
    want = kda.chunk_kda(*packed, initial_state=h0, output_final_state=True, cu_seqlens=cu, kernel=kernel)
    got = kda.chunk_kda(*fused_slices(*packed[:3]), *packed[3:], initial_state=h0, output_final_state=True,
                        cu_seqlens=cu, kernel=kernel)
    for x, y in zip(got, want):
        same_bits(x, y)
    # Decode rows [N, 1, ...] into a pool (B's stride is the token stride), padding included.
    rows = [x[:, :1].reshape(2, 1, *x.shape[2:]).copy() for x in (q, k, v, g, beta)]
    rows = [np.concatenate([x, x]) for x in rows]
    idx = np.array([3, -1, 0, 1], np.int32)
    pools = [np.random.default_rng(22).standard_normal((5, 4, 12, 20)).astype(np.float32) for _ in range(2)]
    o_want, _ = kda.fused_recurrent_kda_fwd(*rows, initial_state=pools[0], ssm_state_indices=idx, kernel=kernel)
    o_got, _ = kda.fused_recurrent_kda_fwd(*fused_slices(*rows[:3]), *rows[3:], initial_state=pools[1],
                                           ssm_state_indices=idx, kernel=kernel)
    same_bits(o_got, o_want)
    same_bits(pools[1], pools[0])


def test_other_qkv_layouts_are_copied_once():
    from kda import _core

    q, k, v, g, beta = problem(B=2, T=5, seed=23)
    want = kda.chunk_kda(q, k, v, g, beta, output_final_state=True)
    # Heads transposed, tokens reversed, a Fortran-order copy: not readable in place, so copied.
    qt = np.ascontiguousarray(q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    kr = np.ascontiguousarray(k[:, ::-1])[:, ::-1]
    vf = np.asfortranarray(v)
    assert not any(_core.reads_in_place(x) for x in (qt, kr, vf))
    got = kda.chunk_kda(qt, kr, vf, g, beta, output_final_state=True)
    for x, y in zip(got, want):
        same_bits(x, y)


def test_strided_g_beta_and_outputs_are_refused():
    # g and beta are read C-contiguous only; outputs and states are never copied: refused, nothing written.
    q, k, v, g, beta = problem(B=1, T=5, seed=24)
    gb = np.concatenate([g.reshape(1, 5, -1), beta], axis=-1)
    g_slice, beta_slice = gb[..., :g[0, 0].size].reshape(g.shape), gb[..., g[0, 0].size:]
    with pytest.raises(ValueError, match=r"chunk_kda: g: must be C-contiguous \(row-major, no gaps\)"):
        kda.chunk_kda(q, k, v, g_slice, beta)
    with pytest.raises(ValueError, match=r"fused_recurrent_kda: beta: must be C-contiguous"):
        kda.fused_recurrent_kda(q, k, v, g, beta_slice)
    out = np.full((1, 5, 4, 40), 7.0, np.float32)[..., ::2]
    with pytest.raises(ValueError, match=r"fused_recurrent_kda: o: must be C-contiguous"):
        kda.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=np.zeros((1, 4, 12, 20), np.float32), out=out)
    assert (out == 7.0).all()
    pool = np.zeros((3, 4, 12, 40), np.float32)[..., ::2]
    with pytest.raises(ValueError, match=r"fused_recurrent_kda: initial_state: must be C-contiguous"):
        kda.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool, ssm_state_indices=np.array([1]))
    assert (pool == 0).all()


# --- the pool and speculative-decoding entry -------------------------------------------------------

def test_fwd_slots_per_token_and_accepted_counts():
    rng = np.random.default_rng(5)
    H, HV, K, V = 1, 2, 8, 12
    q, k, v, g, beta = problem(T=7, H=H, HV=HV, K=K, V=V, seed=5)
    cu = np.array([0, 3, 5, 7])
    idx = np.array([[0, 1, 2], [3, 4, -1], [-1, 5, 6]], np.int32)
    accepted = np.array([2, 1, 1], np.int32)  # sequence 2 reads idx[2, 0] = -1: padding
    pool0 = rng.standard_normal((8, HV, K, V)).astype(np.float32)
    pool = pool0.copy()
    o, s = kda.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu, ssm_state_indices=idx,
                                       num_accepted_tokens=accepted)
    assert s is pool
    for n, read in ((0, 1), (1, 3)):
        for t in range(cu[n + 1] - cu[n]):
            sl = slice(cu[n], cu[n] + t + 1)
            wo, ws = recurrence_f64(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=pool0[read][None])
            close(o[0, cu[n] + t], wo[0, -1], f"o of sequence {n} token {t}")
            if idx[n, t] >= 0:
                close(pool[idx[n, t]], ws[0], f"slot {idx[n, t]}")
    assert not o[0, 5:].any()  # padding
    np.testing.assert_array_equal(pool[[5, 6, 7]], pool0[[5, 6, 7]])
    # The same through fla's public entry, whose **kwargs would drop the pool keywords: honoured.
    pool2 = pool0.copy()
    o2, s2 = kda.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool2, cu_seqlens=cu, ssm_state_indices=idx,
                                     num_accepted_tokens=accepted)
    assert s2 is pool2
    np.testing.assert_array_equal(o2, o)
    np.testing.assert_array_equal(pool2, pool)
    # inplace_final_state=False: the pool only read, the state after every token in a new [T, HV, K, V].
    pool3 = pool0.copy()
    o3, s3 = kda.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool3, cu_seqlens=cu, ssm_state_indices=idx,
                                         num_accepted_tokens=accepted, inplace_final_state=False,
                                         output_final_state=True)
    np.testing.assert_array_equal(pool3, pool0)
    np.testing.assert_array_equal(o3, o)
    assert s3.shape == (7, HV, K, V)
    np.testing.assert_array_equal(s3[2], pool[2])
    assert not s3[5:].any()
    # out= receives o.
    out = np.full_like(o, np.nan)
    o4, _ = kda.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool0.copy(), cu_seqlens=cu,
                                        ssm_state_indices=idx, num_accepted_tokens=accepted, out=out)
    assert o4 is out
    np.testing.assert_array_equal(out, o)


@pytest.mark.parametrize("bad,match", [
    (dict(num_accepted_tokens=np.array([0, 1], np.int32)), r"num_accepted_tokens\[0\] = 0 must be in \[1, 2\]"),
    (dict(ssm_state_indices=np.array([[0, 1], [1, 2]], np.int32)), r"state slot 1 is used by sequences 0 and 1"),
    (dict(ssm_state_indices=np.array([0, 1], np.int32), num_accepted_tokens=np.array([1, 1], np.int32)),
     r"num_accepted_tokens needs 2-D ssm_state_indices"),
    (dict(cu_seqlens=np.array([0, 3, 4])), r"sequence 0 has 3 tokens but ssm_state_indices has 2 slots"),
    (dict(ssm_state_indices=np.array([[0, 4], [2, 3]], np.int32)),
     r"ssm_state_indices\[0, 1\] = 4 is out of range for num_states = 4"),
])
def test_fwd_refuses_bad_slots_without_writing(bad, match):
    q, k, v, g, beta = problem(T=4, H=1, HV=1, K=8, V=8, seed=6)
    pool = np.ones((4, 1, 8, 8), np.float32)
    a = dict(initial_state=pool, cu_seqlens=np.array([0, 2, 4]), ssm_state_indices=np.array([[0, 1], [2, 3]], np.int32))
    a.update(bad)
    with pytest.raises(ValueError, match=match):
        kda.fused_recurrent_kda_fwd(q, k, v, g, beta, **a)
    assert (pool == 1).all()


# --- return_intermediate_states ------------------------------------------------------------------

INTERMEDIATE = [
    # (B, lengths or None for B rows of T, chunk_size, state_v_first)
    (2, None, 32, False),
    (1, [64, 0, 31, 70], 64, False),
    (1, [33, 0, 96, 5], 32, True),
]


@pytest.mark.parametrize("B,lengths,chunk_size,v_first", INTERMEDIATE,
                         ids=["rows-32", "varlen-64", "varlen-32-vfirst"])
@pytest.mark.parametrize("kernel", ["reference", "optimized"])
def test_intermediate_states_match_float64(B, lengths, chunk_size, v_first, kernel):
    # h: the state before each chunk (chunk 0: the initial state), lengths that are and are not multiples of
    # the chunk size, empty sequences, grouped value heads, K != V; o and the final state as without h.
    T = 70 if lengths is None else sum(lengths)
    q, k, v, g, beta = problem(B=B, T=T, H=2, HV=4, K=12, V=20, seed=21)
    cu = None if lengths is None else np.cumsum([0, *lengths]).astype(np.int32)
    N = B if cu is None else len(lengths)
    h0 = np.random.default_rng(22).standard_normal((N, 4, 20, 12) if v_first else (N, 4, 12, 20)).astype(np.float32)
    o, s, h = kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, state_v_first=v_first,
                            cu_seqlens=cu, return_intermediate_states=True, chunk_size=chunk_size, kernel=kernel)
    want_o, want_s, want_h = recurrence_f64(q, k, v, g, beta, initial_state=h0, state_v_first=v_first,
                                            cu_seqlens=cu, chunk_size=chunk_size)
    assert h.dtype == np.float32 and h.shape == want_h.shape
    assert h.shape[1] == (-(-T // chunk_size) if cu is None else sum(-(-n // chunk_size) for n in lengths))
    close(h, want_h, "h")
    close(o, want_o, "o")
    close(s, want_s, "state")
    o2, s2 = kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, state_v_first=v_first,
                           cu_seqlens=cu, chunk_size=chunk_size, kernel=kernel)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(s, s2)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_intermediate_states_in_k_dtype_are_fp32_states_rounded_once(dtype):
    q, k, v, g, beta = problem(T=40, seed=23)
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    o, _, h = kda.chunk_kda(q, k, v, g, beta, return_intermediate_states=True, chunk_size=32)
    _, _, h32 = kda.chunk_kda(*(x.astype(np.float32) for x in (q, k, v)), g, beta, return_intermediate_states=True,
                              chunk_size=32)
    assert h.dtype == np.dtype(dtype) and h.shape == (1, 2, 4, 12, 20)
    np.testing.assert_array_equal(h, h32.astype(dtype))
    assert np.abs(h32[:, 1]).sum() > 0  # chunk 0 is the zero initial state, chunk 1 is not


def test_intermediate_states_refusals_and_empty_batches():
    q, k, v, g, beta = problem(T=5, seed=24)
    with pytest.raises(ValueError, match="return_intermediate_states must be used with disable_recompute=False"):
        kda.chunk_kda(q, k, v, g, beta, return_intermediate_states=True, disable_recompute=True)
    with pytest.raises(ValueError, match="`chunk_size` must be either 32 or 64"):
        kda.chunk_kda(q, k, v, g, beta, return_intermediate_states=True, chunk_size=16)
    # Zero tokens: no chunks.
    o, s, h = kda.chunk_kda(q[:, :0], k[:, :0], v[:, :0], g[:, :0], beta[:, :0], return_intermediate_states=True)
    assert s is None and h.shape == (1, 0, 4, 12, 20)
    # The pool form: chunk 0 is the slot's state, a padding sequence's chunks are zero.
    pool = np.random.default_rng(25).standard_normal((3, 4, 12, 20)).astype(np.float32)
    cu = np.array([0, 2, 5])
    want = kda.chunk_kda(q, k, v, g, beta, initial_state=pool[[2, 0]], cu_seqlens=cu,
                         return_intermediate_states=True)[2]
    o, _, h = kda.chunk_kda(q, k, v, g, beta, initial_state=pool.copy(), cu_seqlens=cu, state_indices=[2, -1],
                            return_intermediate_states=True)
    np.testing.assert_array_equal(h[:, 0], want[:, 0])
    np.testing.assert_array_equal(h[:, 0], pool[None, 2])
    assert not h[:, 1].any() and not o[:, 2:].any()


# --- keywords --------------------------------------------------------------------------------------

def test_unknown_keywords_are_refused_by_name():
    q, k, v, g, beta = problem(T=3)
    with pytest.raises(TypeError, match=r"chunk_kda\(\) got an unexpected keyword argument 'use_l2norm'"):
        kda.chunk_kda(q, k, v, g, beta, use_l2norm=True)
    with pytest.raises(TypeError, match=r"fused_recurrent_kda\(\) got an unexpected keyword argument 'head_first'"):
        kda.fused_recurrent_kda(q, k, v, g, beta, head_first=False)
    with pytest.raises(TypeError, match=r"fused_recurrent_kda_fwd\(\) got an unexpected keyword argument 'foo'"):
        kda.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=np.zeros((1, 4, 12, 20), np.float32), foo=1)
    with pytest.raises(NotImplementedError, match="cp_context"):
        kda.chunk_kda(q, k, v, g, beta, cp_context=object())


def test_hints_and_deprecated_keywords_are_accepted():
    q, k, v, g, beta = problem(T=5)
    want, want_s = kda.chunk_kda(q, k, v, g, beta, output_final_state=True, state_v_first=True)
    o, s = kda.chunk_kda(q, k, v, g, beta, output_final_state=True, state_v_first=True, disable_recompute=True,
                         cu_seqlens_cpu=np.array([0, 5]), use_graph=False, max_num_seqs=4, chunk_size=32)
    np.testing.assert_array_equal(o, want)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        o2, s2 = kda.chunk_kda(q, k, v, g, beta, output_final_state=True, transpose_state_layout=True)
    np.testing.assert_array_equal(s2, want_s)
    assert s2.shape == (1, 4, 20, 12)
    with pytest.raises(ValueError, match="Cannot pass both"):
        kda.chunk_kda(q, k, v, g, beta, state_v_first=True, transpose_state_layout=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kda.fused_recurrent_kda(q, k, v, g, beta)  # nothing deprecated: no warning


FLA_DEPRECATION = "`transpose_state_layout` is deprecated and renamed to `state_v_first`."  # fla's text


def _front_end(name):
    """(chunk_kda, fused_recurrent_kda, fused_recurrent_kda_fwd, array conversion) of a front end."""
    if name == "numpy":
        return kda.chunk_kda, kda.fused_recurrent_kda, kda.fused_recurrent_kda_fwd, lambda x: x
    if name == "torch":
        torch = pytest.importorskip("torch", reason="torch is not installed")
        import kda.torch as kt

        return kt.chunk_kda, kt.fused_recurrent_kda, kt.fused_recurrent_kda_fwd, torch.from_numpy
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    import kda.jax as kj

    return kj.chunk_kda, kj.fused_recurrent_kda, kj.fused_recurrent_kda_fwd, jnp.asarray


@pytest.mark.parametrize("front_end", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("entry", ["chunk_kda", "fused_recurrent_kda", "fused_recurrent_kda_fwd"])
def test_fla_keywords_in_every_front_end(front_end, entry):
    # fla's launch hints are accepted by every entry (fla's recurrent entries take them through **kwargs), the
    # deprecated transpose_state_layout is state_v_first with fla's warning, and other keywords stay refused.
    chunk, recurrent, fwd, conv = _front_end(front_end)
    fn = {"chunk_kda": chunk, "fused_recurrent_kda": recurrent, "fused_recurrent_kda_fwd": fwd}[entry]
    extra = dict(inplace_final_state=False) if entry == "fused_recurrent_kda_fwd" else {}
    q, k, v, g, beta = problem(T=9, seed=30)
    cu = np.array([0, 4, 9])
    h0 = np.random.default_rng(31).standard_normal((2, 4, 20, 12)).astype(np.float32)  # V-first
    arrays = [conv(x) for x in (q, k, v, g, beta)]

    def run(**kw):
        o, s = fn(*arrays, initial_state=conv(h0.copy()), output_final_state=True, cu_seqlens=conv(cu), **extra, **kw)
        return np.asarray(o), np.asarray(s)

    want_o, want_s = recurrence_f64(q, k, v, g, beta, initial_state=h0, state_v_first=True, cu_seqlens=cu)
    o, s = run(state_v_first=True)
    close(o, want_o, "o")
    close(s, want_s, "state")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no hint warns
        hinted = run(state_v_first=True, disable_recompute=True, cu_seqlens_cpu=conv(cu), use_graph=False,
                     max_num_seqs=2)
    for x, y in zip(hinted, (o, s)):
        np.testing.assert_array_equal(x, y)
    with pytest.warns(DeprecationWarning, match=re.escape(FLA_DEPRECATION)):
        deprecated = run(transpose_state_layout=True)
    for x, y in zip(deprecated, (o, s)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="Cannot pass both `state_v_first` and the deprecated"):
        run(state_v_first=True, transpose_state_layout=True)
    with pytest.raises(TypeError, match=rf"{entry}\(\) got an unexpected keyword argument 'foo'"):
        run(state_v_first=True, foo=1)
    if entry == "chunk_kda":
        # chunk_kda reads cu_seqlens_cpu (kda.torch and kda.jax size h from it): it must be cu_seqlens' values.
        with pytest.raises(ValueError, match=r"chunk_kda: cu_seqlens_cpu: must hold cu_seqlens' values: "
                                             r"cu_seqlens_cpu\[1\] = 5, cu_seqlens\[1\] = 4"):
            run(state_v_first=True, cu_seqlens_cpu=conv(np.array([0, 5, 9])))
        with pytest.raises(ValueError, match=r"cu_seqlens_cpu: expected cu_seqlens' 3 values, got 2"):
            run(state_v_first=True, cu_seqlens_cpu=conv(np.array([0, 9])))
    else:
        # A hint there, as in fla (whose **kwargs drops it): not read.
        run(state_v_first=True, cu_seqlens_cpu=conv(np.array([0, 5, 9])))


def test_fla_argument_order_of_fused_recurrent_kda():
    # fla's public order: q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state.
    rng = np.random.default_rng(7)
    q, k, v, g, beta = problem(T=4, seed=7)
    g = rng.standard_normal(g.shape).astype(np.float32)
    a_log = np.zeros(4, np.float32)
    bias = np.zeros(4 * 12, np.float32)
    h0 = rng.standard_normal((1, 4, 12, 20)).astype(np.float32)
    o, s = kda.fused_recurrent_kda(q, k, v, g, beta, a_log, bias, 0.5, h0, True, use_gate_in_kernel=True)
    want_o, want_s = recurrence_f64(q, k, v, g, beta, scale=0.5, initial_state=h0, use_gate_in_kernel=True,
                                    A_log=a_log, dt_bias=bias)
    close(o, want_o, "o")
    close(s, want_s, "state")


def test_fused_kda_gate_both_forms():
    rng = np.random.default_rng(8)
    g = rng.standard_normal((3, 2, 4, 6)).astype(np.float32) * 8
    a_log = rng.standard_normal(4).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    x = g.astype(np.float64) + bias.reshape(4, 6)
    soft = np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    np.testing.assert_allclose(kda.fused_kda_gate(g, a_log, bias), -np.exp(a_log.astype(np.float64))[:, None] * soft,
                               rtol=1e-5, atol=1e-6)
    lb = kda.fused_kda_gate(g, a_log, bias, lower_bound=-5.0)
    np.testing.assert_allclose(lb, -5.0 / (1 + np.exp(-np.exp(a_log.astype(np.float64))[:, None] * x)), rtol=1e-5,
                               atol=1e-6)
    assert (lb < 0).all() and (lb >= -5).all()
    np.testing.assert_allclose(kda.fused_kda_gate(g, None, bias, lower_bound=-2.0), -2.0 / (1 + np.exp(-x)),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="A_log is required"):
        kda.fused_kda_gate(g)


def test_torch_entries_match_numpy():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import kda.torch as kt

    q, k, v, g, beta = problem(T=6, seed=9, logits=True)
    t = [torch.from_numpy(x) for x in (q, k, v, g, beta)]
    opts = dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, state_v_first=True, output_final_state=True)
    for np_entry, t_entry in ((kda.chunk_kda, kt.chunk_kda), (kda.fused_recurrent_kda, kt.fused_recurrent_kda)):
        want_o, want_s = np_entry(q, k, v, g, beta, **opts)
        o, s = t_entry(*t, **opts)
        np.testing.assert_array_equal(o.numpy(), want_o)
        np.testing.assert_array_equal(s.numpy(), want_s)
    h = [x.half() for x in t[:3]]
    o16, _ = kt.chunk_kda(*h, t[3], t[4])
    assert o16.dtype == torch.float16


# --- kda as fla's CPU backend ----------------------------------------------------------------------

def _fla():
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("fla", reason="fla-core is not installed (pip install '.[fla]')")
    import kda.fla  # noqa: F401  (registers kda with fla.backends)
    import fla.ops.kda as fk

    return fk


def test_fla_entries_run_kda_on_cpu():
    import torch

    fk = _fla()
    from fla.ops.kda.gate import fused_kda_gate
    from fla.ops.kda.naive import naive_recurrent_kda

    q, k, v, g, beta = (torch.from_numpy(x) for x in problem(B=2, T=7, H=2, HV=4, K=12, V=20, seed=10))
    h0 = torch.randn(2, 4, 12, 20)
    with torch.no_grad():
        want_o, want_s = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        o, s = fk.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        torch.testing.assert_close(o, want_o, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(s, want_s, rtol=1e-4, atol=1e-5)
        o2, s2 = fk.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        torch.testing.assert_close(o2, want_o, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(s2, want_s, rtol=1e-4, atol=1e-5)
        # fla's gate entry, both forms.
        a_log, bias = torch.randn(4), torch.randn(4 * 12)
        torch.testing.assert_close(fused_kda_gate(g, a_log, bias), torch.from_numpy(kda.fused_kda_gate(g.numpy(), a_log.numpy(), bias.numpy())))
        lb = fused_kda_gate(g, None, bias, lower_bound=-5.0)
        assert (lb < 0).all() and (lb >= -5).all()


def test_fla_dispatch_reads_token_strided_qkv():
    # fla's chunk_kda with q, k, v slices of a fused projection (as engines call it): the backend takes
    # the call and kda reads them in place, the bits of contiguous q, k, v.
    import torch

    fk = _fla()
    q, k, v, g, beta = (torch.from_numpy(x) for x in problem(B=2, T=7, H=2, HV=4, K=12, V=20, seed=12))
    qkv = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2), torch.zeros(2, 7, 5)], dim=-1)
    fq, fk_, fv = qkv[..., :24].view(q.shape), qkv[..., 24:48].view(k.shape), qkv[..., 48:128].view(v.shape)
    assert not fq.is_contiguous() and fq.data_ptr() == qkv.data_ptr()
    with torch.no_grad():
        want_o, want_s = fk.chunk_kda(q, k, v, g, beta, output_final_state=True)
        o, s = fk.chunk_kda(fq, fk_, fv, g, beta, output_final_state=True)
    assert torch.equal(o, want_o) and torch.equal(s, want_s)


def test_fla_refusals_surface_from_kda():
    import torch

    fk = _fla()
    q, k, v, g, beta = (torch.from_numpy(x) for x in problem(T=4, seed=11))
    with torch.no_grad(), pytest.raises(ValueError, match=r"chunk_kda: k: expected shape"):
        fk.chunk_kda(q, k[:, :, :1], v, g, beta)


def test_fla_chunk_kda_returns_intermediate_states():
    import torch

    fk = _fla()
    q, k, v, g, beta = (torch.from_numpy(x) for x in problem(T=70, seed=12))
    cu = torch.tensor([0, 31, 70])
    h0 = torch.randn(2, 4, 12, 20)
    with torch.inference_mode():
        o, s, h = fk.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                               return_intermediate_states=True, chunk_size=32)
    want = kda.chunk_kda(q.numpy(), k.numpy(), v.numpy(), g.numpy(), beta.numpy(), initial_state=h0.numpy(),
                         output_final_state=True, cu_seqlens=cu.numpy(), return_intermediate_states=True,
                         chunk_size=32)
    assert h.shape == (1, 1 + 2, 4, 12, 20)
    for a, b in zip((o, s, h), want):
        np.testing.assert_array_equal(a.numpy(), b)


def test_fla_fused_recurrent_kda_fwd_speculative_through_the_backend(monkeypatch):
    # fla's dispatched fused_recurrent_kda_fwd (vLLM's entry) with 2-D slots and accepted counts: kda takes it and
    # gives its own call's results, the pool updated in place.
    import torch

    _fla()
    import kda.torch as kt
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd as fla_fwd

    calls = []
    real = kt.fused_recurrent_kda_fwd
    monkeypatch.setattr(kt, "fused_recurrent_kda_fwd", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, g, beta = problem(T=7, H=1, HV=2, K=8, V=12, seed=13)
    cu = np.array([0, 3, 5, 7])
    idx = np.array([[0, 1, 2], [3, 4, -1], [-1, 5, 6]], np.int32)
    accepted = np.array([2, 1, 1], np.int32)
    pool0 = np.random.default_rng(14).standard_normal((8, 2, 8, 12)).astype(np.float32)
    want_pool = pool0.copy()
    want_o, _ = kda.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=want_pool, cu_seqlens=cu,
                                            ssm_state_indices=idx, num_accepted_tokens=accepted)
    pool = torch.from_numpy(pool0.copy())
    t = [torch.from_numpy(x) for x in (q, k, v, g, beta)]
    o, s = fla_fwd(*t, initial_state=pool, cu_seqlens=torch.from_numpy(cu), ssm_state_indices=torch.from_numpy(idx),
                   num_accepted_tokens=torch.from_numpy(accepted), inplace_final_state=True)
    assert calls == [1] and s is pool
    np.testing.assert_array_equal(o.numpy(), want_o)
    np.testing.assert_array_equal(pool.numpy(), want_pool)
    assert not np.array_equal(want_pool, pool0)
    # fla's public fused_recurrent_kda drops the pool keywords (its **kwargs) before dispatching, so the backend
    # sees the contiguous call: the indices are ignored there, as fla does (kda's own public entry honours them).
    fk = _fla()
    h0 = torch.randn(3, 2, 8, 12)
    want = fk.fused_recurrent_kda(*t, initial_state=h0, output_final_state=True, cu_seqlens=torch.from_numpy(cu))
    got = fk.fused_recurrent_kda(*t, initial_state=h0, output_final_state=True, cu_seqlens=torch.from_numpy(cu),
                                 ssm_state_indices=torch.tensor([2, 0, 1], dtype=torch.int32))
    assert len(calls) == 3
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.fixture
def fla_spy():
    """A backend after kda's (priority 2) on fla's chunk_kda and its kda operations, recording the calls that
    reach it (the calls kda passes on), removed afterwards."""
    _fla()
    from fla.ops.kda.chunk import chunk_kda as fla_chunk
    from fla_spies import spy_backend

    entries = {"chunk_kda": True, "fused_recurrent_kda_fwd": True, "fused_kda_gate": False}
    with spy_backend("kda_test_spy", entries, (fla_chunk, "kda")) as calls:
        yield calls


def _fla_calls(fk, t, gate=True):
    """fla's dispatched entries on the tensors t (q, k, v, g, beta): chunk_kda, fused_recurrent_kda (through
    fused_recurrent_kda_fwd) and, with ``gate``, fused_kda_gate on g."""
    from fla.ops.kda.gate import fused_kda_gate

    fk.chunk_kda(*t)
    fk.fused_recurrent_kda(*t)
    if gate:
        fused_kda_gate(t[3], t[3].new_zeros(t[3].shape[2]), None)


def test_fla_backend_passes_on_grad_and_cp_context(fla_spy, monkeypatch):
    # Calls kda cannot take go on to fla's next backend (here the spy), never to kda: the chunk entry and the gate
    # with a tensor that requires grad (fla differentiates them), cp_context. The recurrent entry, which has no
    # backward in fla either, stays kda's and returns results without a graph.
    import torch

    import kda.fla
    import kda.torch as kt

    fk = _fla()
    for name in ("chunk_kda", "fused_kda_gate"):
        monkeypatch.setattr(kt, name, lambda *a, _n=name, **kw: pytest.fail(f"kda took {_n}"))
    t = [torch.from_numpy(x) for x in problem(T=5, seed=15)]
    t[0].requires_grad_()
    _fla_calls(fk, t, gate=False)
    assert fla_spy == ["chunk_kda"]
    assert kda.fla.KdaCpuBackend().chunk_kda_verifier(*t) == (False, "kda_cpu: forward-only (a tensor requires grad)")
    t[3].requires_grad_()  # the gate's input
    fla_spy.clear()
    _fla_calls(fk, t)
    assert fla_spy == ["chunk_kda", "fused_kda_gate"]
    o, s = fk.fused_recurrent_kda(*t, output_final_state=True)
    assert not o.requires_grad and not s.requires_grad
    np.testing.assert_array_equal(o.numpy(), kda.fused_recurrent_kda(*(x.detach().numpy() for x in t))[0])
    t = [x.detach() for x in t]
    fla_spy.clear()
    fk.chunk_kda(*t, cp_context=object())
    assert fla_spy == ["chunk_kda"]
    assert kda.fla.KdaCpuBackend().chunk_kda_verifier(*t, cp_context=object()) == (
        False, "kda_cpu: no context parallelism (cp_context)")


def test_fla_backend_takes_inference_calls(fla_spy):
    # The same tensors under no_grad (or without grad) are kda's: the spy sees nothing, the results are kda's.
    import torch

    fk = _fla()
    t = [torch.from_numpy(x) for x in problem(T=5, seed=16)]
    t[0].requires_grad_()
    with torch.no_grad():
        o, _ = fk.chunk_kda(*t)
        _fla_calls(fk, t)
    assert fla_spy == []
    want, _ = kda.chunk_kda(*(x.detach().numpy() for x in t))
    np.testing.assert_array_equal(o.numpy(), want)


def test_fla_kda_cpu_0_disables_the_backend(fla_spy, monkeypatch):
    # fla reads the switch at every call: with FLA_KDA_CPU=0 the calls go on to the next backend.
    import torch

    fk = _fla()
    t = [torch.from_numpy(x) for x in problem(T=5, seed=17)]
    monkeypatch.setenv("FLA_KDA_CPU", "0")
    _fla_calls(fk, t)
    assert fla_spy == ["chunk_kda", "fused_recurrent_kda_fwd", "fused_kda_gate"]
    monkeypatch.setenv("FLA_KDA_CPU", "1")
    fla_spy.clear()
    _fla_calls(fk, t)
    assert fla_spy == []


def test_fla_kda_cpu_0_at_startup():
    # Set before the process starts (the usual way): kda registers but is not enabled, and fla's registries
    # have no active backend on this machine (fla's own kernels run; enabled, kda_cpu is the active one).
    _fla()
    code = """if True:
        from inspect import unwrap
        import kda.fla
        from fla.backends import _function_registries, _operation_registries
        from fla.ops.kda.chunk import chunk_kda
        for registry in (_function_registries[unwrap(chunk_kda)], _operation_registries["kda"]):
            kda_cpu = [b for b in registry._backends.values() if b.backend_type == "kda_cpu"]
            active = registry.get_active()
            print(len(kda_cpu), kda_cpu[0].is_enabled(), active and active.backend_type)
    """
    import os

    env = dict(os.environ, FLA_KDA_CPU="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["1 False None", "1 False None"]
    from fla.backends import _operation_registries

    assert _operation_registries["kda"].get_active().backend_type == "kda_cpu"  # this process: enabled
