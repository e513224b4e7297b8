"""Gated DeltaNet through kda's entries with fla-core 0.6.0's API (chunk_gated_delta_rule,
fused_recurrent_gated_delta_rule, fused_gdn_gate) and vLLM's pool entry
(fused_recurrent_gated_delta_rule_fwd): numpy and PyTorch against the float64 recurrence of
shared/tools/gdn_ref.py and the gdn-* golden cases (fp32 rules of design §5), the torch ops (opcheck,
torch.compile), and kda as fla's CPU backend for GDN."""

import re
import warnings

import ml_dtypes
import numpy as np
import pytest

import kda
from golden import (  # noqa: F401 (gdn_ref: a fixture)
    check_f32,
    check_state_f32,
    gdn_ref,
    golden_dir,
    golden_set_dir,
    load_case,
    read_checkpoint_tensors,
)


def oracle(gdn_ref, q, k, v, g, beta, h0=None, cu=None, scale=None, normalized=False, v_first=False):
    """(o [B, T, HV, V], final states [N, HV, K, V]) of gdn_ref.recurrent per sequence; g and beta are the
    final log decays and betas [B, T, HV]. ``normalized``: q and k have unit rows and the kernel runs
    without its L2 norm (the oracle's norm of 1e3 x is x to 1e-12); ``scale`` replaces K^-0.5 (o is
    linear in it)."""
    q, k, v, g, beta = (np.asarray(x, np.float64) for x in (q, k, v, g, beta))
    if normalized:
        q, k = q * 1e3, k * 1e3
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    seqs = [(b, 0, T) for b in range(B)] if cu is None else [(0, int(a), int(e)) for a, e in zip(cu[:-1], cu[1:])]
    o = np.zeros((B, T, HV, V))
    finals = np.zeros((len(seqs), HV, K, V))
    for n, (b, bos, eos) in enumerate(seqs):
        s0 = np.zeros((HV, K, V)) if h0 is None else np.asarray(h0[n], np.float64)
        if v_first and h0 is not None:
            s0 = s0.transpose(0, 2, 1)
        sl = slice(bos, eos)
        o[b, sl], finals[n] = gdn_ref.recurrent(q[b, sl], k[b, sl], v[b, sl], g[b, sl], beta[b, sl], s0.copy())
    if scale is not None:
        o *= scale * K ** 0.5
    return o, (finals.transpose(0, 1, 3, 2) if v_first else finals)


def problem(B=1, T=9, H=2, r=2, K=12, V=20, seed=0, gmin=-5.0, unit=False, beta_per_value=False):
    """q, k [B, T, H, K], v [B, T, HV, V], g in [gmin, 0] [B, T, HV], beta in (0, 1) float32 (HV = r H)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K)).astype(np.float32)
    k = rng.standard_normal((B, T, H, K)).astype(np.float32)
    if unit:
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, r * H, V)).astype(np.float32)
    g = rng.uniform(gmin, 0.0, (B, T, r * H)).astype(np.float32)
    beta = rng.uniform(0, 1, (B, T, r * H, V) if beta_per_value else (B, T, r * H)).astype(np.float32)
    return q, k, v, g, beta


def states(rng, shape):
    return (0.5 * rng.standard_normal(shape)).astype(np.float32)


def close(got, want, what, state=False):
    (check_state_f32 if state else check_f32)(np.asarray(got, np.float64), want, what=what)


def softplus64(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


# --- against the float64 oracle --------------------------------------------------------------------

@pytest.mark.parametrize("r", [1, 2, 3, 4], ids=lambda r: f"gva{r}")
@pytest.mark.parametrize("kernel", ["reference", "optimized"])
def test_entries_match_float64(gdn_ref, r, kernel):
    # Grouped value heads 1-4, K != V, packed sequences (one empty) with initial states, gates down to -60; chunk
    # sizes 16, 32 and 64 over sequences longer than a chunk; the recurrent entry.
    q, k, v, g, beta = problem(T=40, H=2, r=r, K=12, V=20, seed=r, gmin=-60.0)
    g[0, :20] = np.maximum(g[0, :20] / 30, -2)  # the first sequence: long memories, the second: loud gates
    cu = np.array([0, 17, 17, 40])
    h0 = states(np.random.default_rng(10 + r), (3, 2 * r, 12, 20))
    want_o, want_s = oracle(gdn_ref, q, k, v, g, beta, h0, cu)
    for chunk_size in (16, 32, 64):
        o, s = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True, cu_seqlens=cu, chunk_size=chunk_size,
                                          kernel=kernel)
        assert o.shape == v.shape and o.dtype == np.float32 and s.shape == h0.shape
        close(o, want_o, f"chunk {chunk_size} o")
        close(s, want_s, f"chunk {chunk_size} state", state=True)
    o, s = kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=h0, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True, cu_seqlens=cu, kernel=kernel)
    close(o, want_o, "recurrent o")
    close(s, want_s, "recurrent state", state=True)


GDN_OPTIONS = [
    dict(),
    dict(use_gate_in_kernel=True),
    dict(use_gate_in_kernel=True, no_bias=True),
    dict(use_beta_sigmoid_in_kernel=True),
    dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    dict(scale=0.4, normalized=True),
    dict(state_v_first=True),
]


@pytest.mark.parametrize("opts", GDN_OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_options_match_float64(gdn_ref, opts):
    # fla's options, each against the oracle given the values the option computes (gate, betas, scale, layout),
    # batch rows without cu_seqlens.
    opts = dict(opts)
    rng = np.random.default_rng(3)
    normalized, no_bias = opts.pop("normalized", False), opts.pop("no_bias", False)
    q, k, v, g, beta = problem(B=2, T=7, r=2, seed=4, unit=normalized)
    kw = dict(use_qk_l2norm_in_kernel=not normalized, **opts)
    want_g, want_beta = g, beta
    if opts.get("use_gate_in_kernel"):
        g = (3 * rng.standard_normal(g.shape)).astype(np.float32)
        kw["A_log"] = np.log(rng.uniform(1, 16, 4)).astype(np.float32)
        kw["dt_bias"] = None if no_bias else rng.standard_normal(4).astype(np.float32)
        x = g.astype(np.float64) + (0 if no_bias else kw["dt_bias"].astype(np.float64))
        want_g = -np.exp(kw["A_log"].astype(np.float64)) * softplus64(x)
    if opts.get("use_beta_sigmoid_in_kernel"):
        beta = (3 * rng.standard_normal(beta.shape)).astype(np.float32)
        want_beta = (2.0 if opts.get("allow_neg_eigval") else 1.0) / (1 + np.exp(-beta.astype(np.float64)))
    v_first = opts.get("state_v_first", False)
    h0 = states(rng, (2, 4, 20, 12) if v_first else (2, 4, 12, 20))
    want_o, want_s = oracle(gdn_ref, q, k, v, want_g, want_beta, h0, scale=opts.get("scale"), normalized=normalized,
                            v_first=v_first)
    o, s = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
    close(o, want_o, "chunk o")
    close(s, want_s, "chunk state", state=True)
    # The recurrent entry: fla's keywords in its own order (A_log, dt_bias named in the signature).
    o, s = kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=h0, output_final_state=True,
                                                **kw)
    close(o, want_o, "recurrent o")
    close(s, want_s, "recurrent state", state=True)


def test_beta_per_value_in_the_recurrent_entries(gdn_ref):
    # beta [B, T, HV, V]: each value column with its own scalar beta.
    q, k, v, g, beta = problem(T=6, r=2, seed=5, beta_per_value=True)
    o, s = kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
    cols = [oracle(gdn_ref, q, k, v[..., j:j + 1], g, beta[..., j]) for j in range(v.shape[3])]
    close(o, np.concatenate([c[0] for c in cols], axis=-1), "o")
    close(s, np.concatenate([c[1] for c in cols], axis=-1), "state", state=True)
    with pytest.raises(ValueError, match=r"chunk_gated_delta_rule: beta: expected shape \[B, T, HV\]"):
        kda.chunk_gated_delta_rule(q, k, v, g, beta)


def test_pools_with_padding_and_speculative_slots(gdn_ref):
    # chunk's pool form (state_indices, padding), vLLM's 1-D indices (padding) and 2-D indices with accepted
    # counts: the state after every token into its slot, o from the accepted slot's state.
    rng = np.random.default_rng(6)
    q, k, v, g, beta = problem(T=7, H=1, r=3, K=8, V=12, seed=6, gmin=-20.0)
    cu = np.array([0, 3, 5, 7])
    pool0 = states(rng, (8, 3, 8, 12))
    kw = dict(use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    # chunk_gated_delta_rule's pool: sequence 1 is padding (zero o, no slot touched).
    pool = pool0.copy()
    o, s = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=pool, output_final_state=True,
                                      state_indices=np.array([6, -1, 2]), **kw)
    want_o, want_s = oracle(gdn_ref, q, k, v, g, beta, pool0[[6, 0, 2]], cu)
    assert s is pool and not o[0, 3:5].any()
    close(o[0, :3], want_o[0, :3], "o of sequence 0")
    close(o[0, 5:], want_o[0, 5:], "o of sequence 2")
    close(pool[[6, 2]], want_s[[0, 2]], "slots", state=True)
    np.testing.assert_array_equal(np.delete(pool, [6, 2], axis=0), np.delete(pool0, [6, 2], axis=0))
    # vLLM's entry, 1-D indices: the same.
    pool = pool0.copy()
    o1, s1 = kda.fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, None, pool, True, cu,
                                                      np.array([6, -1, 2], np.int32), use_qk_l2norm_in_kernel=True)
    assert s1 is pool
    close(o1[0, :3], want_o[0, :3], "fwd o of sequence 0")
    close(pool[[6, 2]], want_s[[0, 2]], "fwd slots", state=True)
    assert not o1[0, 3:5].any()
    # 2-D indices and accepted counts: sequence n starts from slot [n, a - 1]; sequence 2 reads -1 (padding).
    idx = np.array([[0, 1, 2], [3, 4, -1], [-1, 5, 7]], np.int32)
    accepted = np.array([2, 1, 1], np.int32)
    pool = pool2d = pool0.copy()
    o2, _ = kda.fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu,
                                                     ssm_state_indices=idx, num_accepted_tokens=accepted,
                                                     use_qk_l2norm_in_kernel=True)
    for n, read in ((0, 1), (1, 3)):
        for t in range(cu[n + 1] - cu[n]):
            sl = slice(cu[n], cu[n] + t + 1)
            wo, ws = oracle(gdn_ref, q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], pool0[read][None])
            close(o2[0, cu[n] + t], wo[0, -1], f"o of sequence {n} token {t}")
            if idx[n, t] >= 0:
                close(pool[idx[n, t]], ws[0], f"slot {idx[n, t]}", state=True)
    assert not o2[0, 5:].any()
    np.testing.assert_array_equal(pool[[5, 6, 7]], pool0[[5, 6, 7]])
    # inplace_final_state=False: vLLM returns the state after every token (output_final_state defaults to True
    # here); the pool is only read. out= receives o.
    pool = pool0.copy()
    out = np.full_like(v, np.nan)
    o3, s3 = kda.fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=pool, inplace_final_state=False,
                                                      cu_seqlens=cu, ssm_state_indices=idx,
                                                      num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True,
                                                      out=out)
    assert o3 is out and s3.shape == (7, 3, 8, 12)
    np.testing.assert_array_equal(out, o2)
    np.testing.assert_array_equal(pool, pool0)
    for n in (0, 1):
        for t in range(cu[n + 1] - cu[n]):
            np.testing.assert_array_equal(s3[cu[n] + t], pool2d[idx[n, t]])
    assert not s3[5:].any()
    # The same through fla's public entry, whose **kwargs would drop the pool keywords: honoured.
    pool = pool0.copy()
    o4, s4 = kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=pool, cu_seqlens=cu,
                                                  ssm_state_indices=idx, num_accepted_tokens=accepted,
                                                  use_qk_l2norm_in_kernel=True)
    assert s4 is pool
    np.testing.assert_array_equal(o4, o2)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_half_precision_inputs(dtype):
    # As the KDA entries: the arithmetic of float32 on the half-precision values, o rounded once.
    q, k, v, g, beta = problem(T=20, seed=7)
    half = [x.astype(dtype) for x in (q, k, v, g, beta)]
    f32 = [x.astype(np.float32) for x in half]
    for entry in (kda.chunk_gated_delta_rule, kda.fused_recurrent_gated_delta_rule):
        o, s = entry(*half[:4], beta=half[4], output_final_state=True, use_qk_l2norm_in_kernel=True)
        o32, s32 = entry(*f32[:4], beta=f32[4], output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert o.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(o.astype(np.float32), o32.astype(dtype).astype(np.float32))
        np.testing.assert_array_equal(s, s32)


# --- fused_recurrent_gated_delta_rule's decays ------------------------------------------------------

def test_recurrent_decays_g_gk_both_and_none():
    rng = np.random.default_rng(8)
    q, k, v, g, beta = problem(T=6, seed=8)
    gk = -rng.uniform(0, 2, (*g.shape, 12)).astype(np.float32)
    h0 = states(rng, (1, 4, 12, 20))
    kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)

    def kda_run(decay, b=beta):
        return kda.fused_recurrent_kda(q, k, v, decay, b, **kw)

    def same(got, want):
        for x, y in zip(got, want):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)

    # g alone: the scalar gate, KDA's recurrence with g broadcast over K.
    same(kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, **kw), kda_run(np.repeat(g[..., None], 12, -1)))
    # gk alone: KDA's recurrence.
    same(kda.fused_recurrent_gated_delta_rule(q, k, v, gk=gk, beta=beta, **kw), kda_run(gk))
    # Both: fla multiplies the decays.
    same(kda.fused_recurrent_gated_delta_rule(q, k, v, g, gk, beta=beta, **kw), kda_run(gk + g[..., None]))
    # Both with the gate in the kernel: fla applies it to g only.
    raw = rng.standard_normal(g.shape).astype(np.float32)
    a_log, bias = np.log(rng.uniform(1, 4, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    gate = kda.fused_gdn_gate(raw, a_log, bias)
    same(kda.fused_recurrent_gated_delta_rule(q, k, v, raw, gk, beta=beta, use_gate_in_kernel=True, A_log=a_log,
                                              dt_bias=bias, **kw), kda_run(gk + gate[..., None]))
    same(kda.fused_recurrent_gated_delta_rule(q, k, v, raw, beta=beta, use_gate_in_kernel=True, A_log=a_log,
                                              dt_bias=bias, **kw), kda_run(np.repeat(gate[..., None], 12, -1)))
    # Without the gate in the kernel A_log and dt_bias are ignored (as fla).
    same(kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, A_log=a_log, dt_bias=bias[:1], **kw),
         kda_run(np.repeat(g[..., None], 12, -1)))
    # Neither: no decay. beta None: ones.
    same(kda.fused_recurrent_gated_delta_rule(q, k, v, beta=beta, **kw), kda_run(np.zeros_like(gk)))
    same(kda.fused_recurrent_gated_delta_rule(q, k, v, g, **kw),
         kda_run(np.repeat(g[..., None], 12, -1), np.ones_like(beta)))
    # gv: refused by name; fla's checks of the gate; shapes named.
    with pytest.raises(NotImplementedError, match="gv"):
        kda.fused_recurrent_gated_delta_rule(q, k, v, g, gv=np.zeros_like(v), beta=beta)
    with pytest.raises(ValueError, match=re.escape("`A_log` must be provided when `use_gate_in_kernel=True`.")):
        kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=re.escape("`g` (raw pre-activation) must be provided")):
        kda.fused_recurrent_gated_delta_rule(q, k, v, gk=gk, beta=beta, use_gate_in_kernel=True, A_log=a_log)
    with pytest.raises(ValueError, match=r"fused_recurrent_gated_delta_rule: gk: expected shape \[B, T, HV, K\] = "
                                         r"\[1, 6, 4, 12\], got \[1, 6, 4, 3\]"):
        kda.fused_recurrent_gated_delta_rule(q, k, v, g, gk[..., :3], beta=beta)
    with pytest.raises(ValueError, match=r"fused_recurrent_gated_delta_rule: g: expected shape \[B, T, HV\]"):
        kda.fused_recurrent_gated_delta_rule(q, k, v, g[:, :3], beta=beta)
    with pytest.raises(ValueError, match="allow_neg_eigval=True requires use_beta_sigmoid_in_kernel"):
        kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, allow_neg_eigval=True)


# --- keywords and refusals -------------------------------------------------------------------------

def test_keywords_and_refusals():
    q, k, v, g, beta = problem(T=5, seed=9)
    pool = np.zeros((2, 4, 12, 20), np.float32)
    chunk, rec, fwd = (kda.chunk_gated_delta_rule, kda.fused_recurrent_gated_delta_rule,
                       kda.fused_recurrent_gated_delta_rule_fwd)
    for fn, name, extra in ((chunk, "chunk_gated_delta_rule", {}), (rec, "fused_recurrent_gated_delta_rule", {}),
                            (fwd, "fused_recurrent_gated_delta_rule_fwd", dict(initial_state=pool[:1]))):
        with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'foo'"):
            fn(q, k, v, g, beta=beta, foo=1, **extra)
    with pytest.raises(TypeError, match=r"chunk_gated_delta_rule\(\) got an unexpected keyword argument "
                                        r"'disable_recompute'"):
        chunk(q, k, v, g, beta, disable_recompute=True)  # a chunk_kda keyword fla's GDN entry does not take
    with pytest.raises(DeprecationWarning, match=re.escape("head_first has been removed")):
        chunk(q, k, v, g, beta, head_first=False)
    with pytest.raises(NotImplementedError, match="cp_context"):
        chunk(q, k, v, g, beta, cp_context=object())
    with pytest.raises(NotImplementedError, match="retrieve_parent_token"):
        fwd(q, k, v, g, beta, None, pool[:1], retrieve_parent_token=np.zeros((1, 5), np.int32))
    with pytest.raises(ValueError, match=re.escape("chunk_gated_delta_rule: `chunk_size` must be 16, 32, or 64 for "
                                                   "Gated Delta Rule, got 48.")):
        chunk(q, k, v, g, beta, chunk_size=48)
    with pytest.raises(ValueError, match=r"chunk_gated_delta_rule: g: expected shape \[B, T, HV\]"):
        chunk(q, k, v, np.repeat(g[..., None], 12, -1), beta)
    with pytest.raises(ValueError, match=r"chunk_gated_delta_rule: A_log: required with use_gate_in_kernel"):
        chunk(q, k, v, g, beta, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"dt_bias: expected HV = 4 elements"):
        chunk(q, k, v, g, beta, use_gate_in_kernel=True, A_log=np.zeros(4), dt_bias=np.zeros(48))
    with pytest.raises(ValueError, match=r"fused_recurrent_gated_delta_rule: initial_state: required with "
                                         r"inplace_final_state=True"):
        fwd(q, k, v, g, beta)
    with pytest.raises(ValueError, match=r"cu_seqlens_cpu: must hold cu_seqlens' values"):
        chunk(q, k, v, g, beta, cu_seqlens=np.array([0, 2, 5]), cu_seqlens_cpu=np.array([0, 3, 5]))
    # Hints accepted (chunk_indices, cu_seqlens_cpu), the deprecated transpose_state_layout with fla's warning.
    want_o, want_s = chunk(q, k, v, g, beta, output_final_state=True, state_v_first=True)
    o, _ = chunk(q, k, v, g, beta, cu_seqlens=np.array([0, 5]), cu_seqlens_cpu=[0, 5],
                 chunk_indices=np.array([[0, 0]]))
    np.testing.assert_array_equal(o, want_o)
    for fn in (chunk, rec):
        with pytest.warns(DeprecationWarning, match="`transpose_state_layout` is deprecated"):
            o, s = fn(q, k, v, g, beta=beta, output_final_state=True, transpose_state_layout=True)
        np.testing.assert_allclose(s, want_s, rtol=1e-6, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rec(q, k, v, g, beta=beta, cu_seqlens_cpu=[0, 5], chunk_indices=None, kernel="reference")


def test_vllm_positional_order_and_defaults():
    # vLLM's order: q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
    # num_accepted_tokens, retrieve_parent_token, use_qk_l2norm_in_kernel.
    q, k, v, g, beta = problem(B=2, T=1, seed=10)
    pool0 = states(np.random.default_rng(11), (3, 4, 12, 20))
    idx = np.array([2, 0], np.int32)
    pool = pool0.copy()
    o, s = kda.fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, 0.3, pool, True, None, idx, None, None, True)
    assert s is pool
    want_o, want_s = kda.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, scale=0.3, initial_state=pool0[idx],
                                                          output_final_state=True, use_qk_l2norm_in_kernel=True)
    np.testing.assert_array_equal(o, want_o)
    np.testing.assert_array_equal(pool[idx], want_s)
    np.testing.assert_array_equal(pool[1], pool0[1])
    # Contiguous states, not in place: the new final states (output_final_state's default is True here).
    o2, s2 = kda.fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, 0.3, pool0[idx], False,
                                                      use_qk_l2norm_in_kernel=True)
    np.testing.assert_array_equal(o2, want_o)
    np.testing.assert_array_equal(s2, want_s)
    assert kda.fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, 0.3, pool0[idx], False,
                                                    output_final_state=False)[1] is None


def test_fused_gdn_gate():
    rng = np.random.default_rng(12)
    g = (8 * rng.standard_normal((3, 5, 4))).astype(np.float32)
    g[0, 0] = [30.0, -30.0, 19.9, 20.1]  # both sides of softplus' threshold
    a_log = rng.standard_normal(4).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    x = g.astype(np.float64) + bias
    want = -np.exp(a_log.astype(np.float64)) * softplus64(x)
    got = kda.fused_gdn_gate(g, a_log, bias)
    assert got.dtype == np.float32 and got.shape == g.shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    # A_log as fla's tests shape it ([1, 1, HV, 1]: HV elements), no dt_bias, another output dtype.
    np.testing.assert_allclose(kda.fused_gdn_gate(g, a_log.reshape(1, 1, 4, 1)),
                               -np.exp(a_log.astype(np.float64)) * softplus64(g.astype(np.float64)), rtol=2e-6,
                               atol=1e-6)
    assert kda.fused_gdn_gate(g, a_log, output_dtype=ml_dtypes.bfloat16).dtype == ml_dtypes.bfloat16
    with pytest.raises(ValueError, match=r"fused_gdn_gate: A_log: expected HV = 4 elements"):
        kda.fused_gdn_gate(g, a_log[:3])
    with pytest.raises(ValueError, match=r"fused_gdn_gate: dt_bias: expected HV = 4 elements"):
        kda.fused_gdn_gate(g, a_log, np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="fused_gdn_gate: A_log is required"):
        kda.fused_gdn_gate(g, None)


# --- golden cases ----------------------------------------------------------------------------------

def gdn_cases():
    """(set, case) of the gdn-* golden sets; a placeholder (skipped or failed by load_case) without them."""
    root = golden_dir()
    sets = sorted(root.glob("gdn-*")) if root.is_dir() else []
    cases = [(d.name, f.stem) for d in sets for f in sorted(d.glob("*.safetensors")) if f.name != "model.safetensors"]
    return cases or [("gdn-mini", "single_T8")]


@pytest.mark.parametrize("set_name,case", gdn_cases(), ids=lambda x: x)
def test_golden_cases(set_name, case):
    # q_conv, k_conv (before the L2 norm), v_conv, g, beta -> o_gdn and the final recurrent state, fp32 rules; the
    # chunk entry, the recurrent one (optimized and reference), the gate in the kernel from g_raw, and the pool form.
    d = load_case(set_name, case)
    cu = d["cu_seqlens"].astype(np.int64)
    init = d.get("initial_recurrent_state")
    toks = [d[n][None] for n in ("q_conv", "k_conv", "v_conv")]
    kw = dict(initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    names = ["model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.dt_bias"]
    w = read_checkpoint_tensors(golden_set_dir(set_name), names)
    a_log, dt_bias = (w[n].astype(np.float32) for n in names)
    runs = {
        "chunk": lambda: kda.chunk_gated_delta_rule(*toks, d["g"][None], d["beta"][None], **kw),
        "chunk gate in kernel": lambda: kda.chunk_gated_delta_rule(*toks, d["g_raw"][None], d["beta"][None],
                                                                    use_gate_in_kernel=True, A_log=a_log,
                                                                    dt_bias=dt_bias, **kw),
        "recurrent": lambda: kda.fused_recurrent_gated_delta_rule(*toks, d["g"][None], beta=d["beta"][None], **kw),
        "recurrent reference": lambda: kda.fused_recurrent_gated_delta_rule(
            *toks, d["g_raw"][None], beta=d["beta"][None], use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
            kernel="reference", **kw),
    }
    for what, run in runs.items():
        o, s = run()
        check_f32(o[0], d["o_gdn"], what=f"{what} o")
        check_state_f32(s, d["final_recurrent_state"], what=f"{what} final state")
    # The pool form: sequence n in slot N - 1 - n of a pool with one spare slot.
    N = cu.size - 1
    pool = np.zeros((N + 1, *d["final_recurrent_state"].shape[1:]), np.float32)
    slots = np.arange(N)[::-1] + 1
    if init is not None:
        pool[slots] = init
    o, s = kda.chunk_gated_delta_rule(*toks, d["g"][None], d["beta"][None], initial_state=pool,
                                      output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                      state_indices=slots, chunk_size=32)
    assert s is pool and not pool[0].any()
    check_f32(o[0], d["o_gdn"], what="pool o")
    check_state_f32(pool[slots], d["final_recurrent_state"], what="pool states")


# --- kda.torch ---------------------------------------------------------------------------------------

def _torch():
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")
    import kda.torch as kt

    return torch, kt


def _t(*xs):
    import torch

    return [None if x is None else torch.from_numpy(np.ascontiguousarray(x)) for x in xs]


def test_torch_ops_registered_and_exported():
    torch, kt = _torch()
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule_fwd",
                 "fused_gdn_gate"):
        assert name in kt.__all__ and name in kda.__all__
    schema = str(torch.ops.kda.chunk_gated_delta_rule.default._schema)
    assert "Tensor(a6!)? initial_state" in schema and schema.count("!") == 1
    assert schema.endswith("str kernel, SymInt[]? cu_seqlens_cpu=None) -> (Tensor, Tensor)")
    schema = str(torch.ops.kda.fused_recurrent_gated_delta_rule_fwd.default._schema)
    assert "Tensor(a6!)? initial_state" in schema and "Tensor(a20!)? out=None" in schema and schema.count("!") == 2
    assert str(torch.ops.kda.fused_gdn_gate.default._schema).count("!") == 0


def _gdn_chunk_args(pool_form=False, **options):
    """torch.ops.kda.chunk_gated_delta_rule's arguments (its schema's order)."""
    import torch

    q, k, v, g, beta = _t(*problem(T=7, r=2, seed=13, gmin=-30.0))
    a = dict(q=q, k=k, v=v, g=g, beta=beta, scale=None, initial_state=torch.randn(2, 4, 12, 20),
             output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=False,
             allow_neg_eigval=False, state_v_first=False, cu_seqlens=torch.tensor([0, 3, 7]),
             use_gate_in_kernel=False, A_log=None, dt_bias=None, chunk_size=16, state_indices=None, kernel="auto",
             cu_seqlens_cpu=None)
    if pool_form:
        a.update(initial_state=torch.randn(3, 4, 12, 20), state_indices=torch.tensor([2, -1], dtype=torch.int32))
    a.update(options)
    return a


def _gdn_fwd_args(**options):
    """torch.ops.kda.fused_recurrent_gated_delta_rule_fwd's arguments (its schema's order)."""
    import torch

    q, k, v, g, beta = _t(*problem(T=3, r=2, seed=14))
    a = dict(q=q, k=k, v=v, g=g, beta=beta, scale=None, initial_state=torch.randn(4, 4, 12, 20),
             inplace_final_state=True, cu_seqlens=torch.arange(4),
             ssm_state_indices=torch.tensor([3, -1, 0], dtype=torch.int32), num_accepted_tokens=None,
             use_qk_l2norm_in_kernel=True, A_log=None, dt_bias=None, use_gate_in_kernel=False,
             use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False, output_final_state=False,
             kernel="auto", out=None)
    a.update(options)
    return a


def test_torch_opcheck():
    torch, kt = _torch()
    op = torch.ops.kda.chunk_gated_delta_rule.default
    torch.library.opcheck(op, tuple(_gdn_chunk_args().values()))
    torch.library.opcheck(op, tuple(_gdn_chunk_args(pool_form=True).values()))
    torch.library.opcheck(op, tuple(_gdn_chunk_args(use_gate_in_kernel=True, A_log=torch.randn(4),
                                                    dt_bias=torch.randn(4), state_v_first=True,
                                                    initial_state=torch.randn(2, 4, 20, 12),
                                                    cu_seqlens_cpu=[0, 3, 7]).values()))
    op = torch.ops.kda.fused_recurrent_gated_delta_rule_fwd.default
    torch.library.opcheck(op, tuple(_gdn_fwd_args().values()))
    # Contiguous states, a new final state; 2-D slots with accepted counts, a state per token, o into out.
    torch.library.opcheck(op, tuple(_gdn_fwd_args(initial_state=torch.randn(2, 4, 12, 20), inplace_final_state=False,
                                                  output_final_state=True, cu_seqlens=torch.tensor([0, 1, 3]),
                                                  ssm_state_indices=None).values()))
    torch.library.opcheck(op, tuple(_gdn_fwd_args(
        cu_seqlens=torch.tensor([0, 2, 3]), inplace_final_state=False, output_final_state=True,
        ssm_state_indices=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32),
        num_accepted_tokens=torch.tensor([2, 1], dtype=torch.int32), out=torch.zeros(1, 3, 4, 20)).values()))
    torch.library.opcheck(torch.ops.kda.fused_gdn_gate.default,
                          (torch.randn(2, 3, 4).bfloat16(), torch.randn(4), torch.randn(4)))


def test_torch_entries_match_numpy():
    torch, kt = _torch()
    rng = np.random.default_rng(15)
    q, k, v, g, beta = problem(T=9, r=2, seed=15)
    gk = -rng.uniform(0, 1, (*g.shape, 12)).astype(np.float32)
    raw, a_log, bias = (rng.standard_normal(s).astype(np.float32) for s in (g.shape, 4, 4))
    h0 = states(rng, (2, 4, 12, 20))
    cu = np.array([0, 4, 9])
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    calls = [
        ("chunk_gated_delta_rule", (q, k, v, g, beta), dict(initial_state=h0, cu_seqlens=cu, chunk_size=32)),
        ("chunk_gated_delta_rule", (q, k, v, raw, beta), dict(use_gate_in_kernel=True, A_log=a_log, dt_bias=bias)),
        ("fused_recurrent_gated_delta_rule", (q, k, v, g), dict(beta=beta, initial_state=h0, cu_seqlens=cu)),
        ("fused_recurrent_gated_delta_rule", (q, k, v, raw, gk), dict(use_gate_in_kernel=True, A_log=a_log,
                                                                      dt_bias=bias)),
        ("fused_recurrent_gated_delta_rule", (q, k, v), dict()),
    ]
    for name, args, extra in calls:
        want = getattr(kda, name)(*args, **kw, **{n: x for n, x in extra.items()})
        got = getattr(kt, name)(*_t(*args), **kw, **{n: (_t(x)[0] if isinstance(x, np.ndarray) else x)
                                                     for n, x in extra.items()})
        for a, b in zip(got, want):
            assert isinstance(a, torch.Tensor)
            np.testing.assert_array_equal(a.numpy(), b, err_msg=name)
    y = kt.fused_gdn_gate(*_t(raw, a_log, bias))
    assert y.dtype == torch.float32
    np.testing.assert_array_equal(y.numpy(), kda.fused_gdn_gate(raw, a_log, bias))
    assert kt.fused_gdn_gate(*_t(raw, a_log), output_dtype=torch.bfloat16).dtype == torch.bfloat16
    # vLLM's entry: the pool in place, out written in place.
    pools = [torch.from_numpy(states(rng, (3, 4, 12, 20))) for _ in range(2)]
    pools[1].copy_(pools[0])
    idx = torch.tensor([[2, 0], [1, -1]], dtype=torch.int32)
    t = _t(q[:, :3], k[:, :3], v[:, :3], g[:, :3], beta[:, :3])
    want_o, _ = kda.fused_recurrent_gated_delta_rule_fwd(*t, None, pools[0], cu_seqlens=np.array([0, 2, 3]),
                                                         ssm_state_indices=idx.numpy())
    out = torch.full_like(t[2], float("nan"))
    o, s = kt.fused_recurrent_gated_delta_rule_fwd(*t, None, pools[1], cu_seqlens=torch.tensor([0, 2, 3]),
                                                   ssm_state_indices=idx, out=out)
    assert o is out and s is pools[1]
    assert torch.equal(out, want_o) and torch.equal(pools[1], pools[0])
    with pytest.raises(ValueError, match=r"fused_recurrent_gated_delta_rule_fwd: out: expected shape"):
        kt.fused_recurrent_gated_delta_rule_fwd(*t, None, pools[1], ssm_state_indices=idx[:, 0].contiguous(),
                                                out=torch.zeros(1, 3, 4, 20, dtype=torch.float16))


def test_torch_grad_policy():
    # fla's recurrent entries have no backward: kda's read tensors that require grad and return results without a
    # graph (KDA's too); the chunk entries and the gates refuse them under grad mode, read them under no_grad.
    torch, kt = _torch()
    q, k, v, g, beta = _t(*problem(T=4, seed=16))
    gk = -torch.rand(*g.shape, 12)
    h0 = torch.randn(1, 4, 12, 20, requires_grad=True)
    q.requires_grad_()
    want = kda.fused_recurrent_gated_delta_rule(q.detach().numpy(), k.numpy(), v.numpy(), g.numpy(),
                                                beta=beta.numpy(), initial_state=h0.detach().numpy(),
                                                output_final_state=True)
    for fn in (kt.fused_recurrent_gated_delta_rule, kda.fused_recurrent_gated_delta_rule):
        o, s = fn(q, k, v, g, beta=beta, initial_state=h0, output_final_state=True)
        assert not o.requires_grad and not s.requires_grad
        np.testing.assert_array_equal(o.numpy(), want[0])
    pool = torch.zeros(2, 4, 12, 20, requires_grad=True)
    o, s = kt.fused_recurrent_gated_delta_rule_fwd(q, k, v, g.requires_grad_(), beta, None, pool,
                                                   ssm_state_indices=torch.tensor([1], dtype=torch.int32))
    assert s is pool and not o.requires_grad and pool[1].detach().abs().sum() > 0
    o, _ = kt.fused_recurrent_gated_delta_rule(q, k, v, gk=gk.requires_grad_(), beta=beta)
    assert not o.requires_grad
    o, _ = kt.fused_recurrent_kda(q, k, v, gk, beta, initial_state=h0, output_final_state=True)
    assert not o.requires_grad
    o, _ = kt.fused_recurrent_kda_fwd(q, k, v, gk, beta, initial_state=torch.zeros(1, 4, 12, 20),
                                      inplace_final_state=False)
    assert not o.requires_grad
    for run in (lambda: kt.chunk_gated_delta_rule(q, k, v, g, beta),
                lambda: kda.chunk_gated_delta_rule(q, k, v, g, beta),
                lambda: kt.fused_gdn_gate(g, torch.zeros(4)),
                lambda: kda.fused_gdn_gate(g, torch.zeros(4)),
                lambda: kt.fused_kda_gate(gk, torch.zeros(4))):
        with pytest.raises(RuntimeError, match="requires grad, but kda is forward-only"):
            run()
    with torch.no_grad():
        kt.chunk_gated_delta_rule(q, k, v, g, beta)
        kt.fused_gdn_gate(g, torch.zeros(4))


def test_torch_compile_without_graph_breaks():
    torch, kt = _torch()
    torch._dynamo.reset()
    idx = torch.tensor([1], dtype=torch.int32)

    def step(q, k, v, raw, beta, a_log, bias, init, pool):
        g = kt.fused_gdn_gate(raw, a_log, bias)
        o, s = kt.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True, chunk_size=16)
        o2, s2 = kt.fused_recurrent_gated_delta_rule(q, k, v, raw, initial_state=init, output_final_state=True,
                                                     use_gate_in_kernel=True, A_log=a_log, dt_bias=bias)
        o3, _ = kt.fused_recurrent_gated_delta_rule(q, k, v, beta=beta)  # no decay: g filled with zeros
        rows = [x[:, :1].transpose(0, 1).contiguous() for x in (q, k, v, g, beta)]
        o4, _ = kt.fused_recurrent_gated_delta_rule_fwd(*rows, None, pool, ssm_state_indices=idx)
        return o * 2, s.sum(), o2, s2, o3, o4

    q, k, v, raw, beta = _t(*problem(B=1, T=20, r=2, seed=17))
    raw = raw * 3
    a_log, bias, init = torch.randn(4), torch.randn(4), torch.randn(1, 4, 12, 20)
    pool_e, pool_c = torch.zeros(2, 4, 12, 20), torch.zeros(2, 4, 12, 20)
    want = step(q, k, v, raw, beta, a_log, bias, init, pool_e)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, raw, beta, a_log, bias, init, pool_c)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(pool_c, pool_e, rtol=0, atol=0)
    assert pool_c.abs().sum() > 0


# --- kda as fla's CPU backend for GDN --------------------------------------------------------------

def _fla():
    _torch()
    pytest.importorskip("fla", reason="fla-core is not installed (pip install '.[fla]')")
    import kda.fla  # noqa: F401  (registers kda with fla.backends)
    import fla.ops.gated_delta_rule as fg

    return fg


def test_fla_gdn_entries_run_kda_on_cpu(monkeypatch):
    import torch

    import kda.torch as kt

    fg = _fla()
    from fla.ops.gated_delta_rule.gate import fused_gdn_gate, gdn_gate_chunk_cumsum

    calls = []
    for name in ("chunk_gated_delta_rule", "fused_gdn_gate"):
        real = getattr(kt, name)
        monkeypatch.setattr(kt, name, lambda *a, _n=name, _f=real, **kw: calls.append(_n) or _f(*a, **kw))
    q, k, v, g, beta = problem(T=9, r=2, seed=18)
    t = _t(q, k, v, g, beta)
    h0 = torch.randn(2, 4, 12, 20)
    cu = torch.tensor([0, 4, 9])
    o, s = fg.chunk_gated_delta_rule(*t, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                     cu_seqlens=cu, chunk_size=16)
    want = kda.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0.numpy(), output_final_state=True,
                                      use_qk_l2norm_in_kernel=True, cu_seqlens=cu.numpy())
    assert calls == ["chunk_gated_delta_rule"]
    np.testing.assert_array_equal(o.numpy(), want[0])
    np.testing.assert_array_equal(s.numpy(), want[1])
    # The gate in the kernel: fla's keywords through **kwargs.
    raw, a_log, bias = torch.randn(1, 9, 4), torch.randn(4), torch.randn(4)
    o, _ = fg.chunk_gated_delta_rule(*t[:3], raw, t[4], use_gate_in_kernel=True, A_log=a_log, dt_bias=bias)
    want = kda.chunk_gated_delta_rule(q, k, v, raw.numpy(), beta, use_gate_in_kernel=True, A_log=a_log.numpy(),
                                      dt_bias=bias.numpy())
    np.testing.assert_array_equal(o.numpy(), want[0])
    # fla's fused_gdn_gate through its dispatched gdn_gate_fwd.
    calls.clear()
    y = fused_gdn_gate(raw, a_log, bias)
    assert calls == ["fused_gdn_gate"] and y.dtype == torch.float32
    np.testing.assert_array_equal(y.numpy(), kda.fused_gdn_gate(raw.numpy(), a_log.numpy(), bias.numpy()))
    # gdn_gate_chunk_cumsum: the gate summed within each chunk of each sequence, times scale.
    x = 5 * torch.randn(1, 23, 4)
    gate = kda.fused_gdn_gate(x.numpy(), a_log.numpy(), bias.numpy()).astype(np.float64)
    for cu_, spans in ((None, [(0, 23)]), (torch.tensor([0, 10, 10, 23]), [(0, 10), (10, 23)])):
        got = gdn_gate_chunk_cumsum(x, a_log, 8, scale=1.5, dt_bias=bias, cu_seqlens=cu_)
        assert got.shape == x.shape and got.dtype == torch.float32
        want = np.zeros_like(gate)
        for a, e in spans:
            for c in range(a, e, 8):
                want[0, c:min(c + 8, e)] = 1.5 * np.cumsum(gate[0, c:min(c + 8, e)], axis=0)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    assert gdn_gate_chunk_cumsum(x, a_log, 16, output_dtype=None).dtype == torch.float32


@pytest.fixture
def gdn_spy():
    """A backend after kda's (priority 2) on fla's gated_delta_rule operations, recording the calls that reach it
    (the calls kda passes on), removed afterwards."""
    _fla()
    from fla_spies import spy_backend

    with spy_backend("kda_test_gdn_spy", {"chunk_gated_delta_rule": True, "gdn_gate_fwd": False},
                     ("gated_delta_rule",)) as calls:
        yield calls


def test_fla_gdn_backend_passes_on_grad_cp_context_and_kda_cpu_0(gdn_spy, monkeypatch):
    import torch

    import kda.fla

    fg = _fla()
    from fla.ops.gated_delta_rule.gate import fused_gdn_gate

    t = _t(*problem(T=5, r=2, seed=19))
    a_log = torch.zeros(4)
    # Inference calls are kda's.
    fg.chunk_gated_delta_rule(*t)
    fused_gdn_gate(t[3], a_log)
    assert gdn_spy == []
    # A tensor that requires grad (fla differentiates the chunk entry), cp_context: passed on.
    t[0].requires_grad_()
    fg.chunk_gated_delta_rule(*t)
    assert gdn_spy == ["chunk_gated_delta_rule"]
    assert kda.fla.KdaCpuGatedDeltaRuleBackend().chunk_gated_delta_rule_verifier(*t) == (
        False, "kda_cpu: forward-only (a tensor requires grad)")
    assert kda.fla.KdaCpuGatedDeltaRuleBackend().chunk_gated_delta_rule_verifier(
        *(x.detach() for x in t), cp_context=object()) == (False, "kda_cpu: no context parallelism (cp_context)")
    t[0] = t[0].detach()
    # FLA_KDA_CPU=0, read at every call: fla's next backend.
    gdn_spy.clear()
    monkeypatch.setenv("FLA_KDA_CPU", "0")
    fg.chunk_gated_delta_rule(*t)
    fused_gdn_gate(t[3], a_log)
    assert gdn_spy == ["chunk_gated_delta_rule", "gdn_gate_fwd"]
    monkeypatch.setenv("FLA_KDA_CPU", "1")
    gdn_spy.clear()
    fg.chunk_gated_delta_rule(*t)
    assert gdn_spy == []
