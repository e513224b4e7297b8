"""kda.torch: the custom operators against the numpy API and the golden cases, opcheck, and
torch.compile tracing them."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[torch]')")
import kda  # noqa: E402
import kda.torch as kt  # noqa: E402
from golden import check_f32, check_state_f32, load_case  # noqa: E402

H, K = 2, 16


def tensors(B=1, T=6, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, K, generator=gen).to(dtype) for _ in range(3))
    g = -0.1 * torch.rand(B, T, H, K, generator=gen)
    beta = torch.rand(B, T, H, generator=gen)
    return q, k, v, g, beta


def test_ops_registered():
    assert hasattr(torch.ops.kda, "chunk_kda") and hasattr(torch.ops.kda, "fused_recurrent_kda_fwd")
    schema = str(torch.ops.kda.chunk_kda.default._schema)
    # The state pool is declared mutated; nothing else is.
    assert "Tensor(a6!)? initial_state" in schema and schema.count("!") == 1
    schema = str(torch.ops.kda.fused_recurrent_kda_fwd.default._schema)
    assert "Tensor(a7!)? initial_state" in schema and schema.count("!") == 1


def test_golden_case_through_the_ops():
    d = load_case("kda-mini", "varlen_initstate")
    t = {n: torch.from_numpy(d[n]) for n in ("q_conv", "k_conv", "v_conv", "g", "beta", "initial_recurrent_state")}
    cu = torch.from_numpy(d["cu_seqlens"].astype(np.int64))
    o, s = kt.chunk_kda(t["q_conv"][None], t["k_conv"][None], t["v_conv"][None], t["g"][None], t["beta"][None],
                        initial_state=t["initial_recurrent_state"], output_final_state=True,
                        use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    check_f32(o[0].numpy(), d["o_kda"], what="o")
    check_state_f32(s.numpy(), d["final_recurrent_state"], what="final state")
    # The pool form: the pool updated in place, returned as the final state.
    pool = torch.zeros(6, 4, 128, 128)
    slots = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
    pool[slots.long()] = t["initial_recurrent_state"]
    o2, s2 = kt.chunk_kda(t["q_conv"][None], t["k_conv"][None], t["v_conv"][None], t["g"][None], t["beta"][None],
                          initial_state=pool, output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                          state_indices=slots)
    assert s2 is pool
    check_f32(o2[0].numpy(), d["o_kda"], what="o")
    check_state_f32(pool[slots.long()].numpy(), d["final_recurrent_state"], what="pool")


def test_fused_recurrent_matches_numpy_api():
    q, k, v, g, beta = tensors(B=3, T=1, seed=1)
    pool = torch.randn(5, H, K, K)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32)
    want_pool = pool.numpy().copy()
    want_o, _ = kda.fused_recurrent_kda(q.numpy(), k.numpy(), v.numpy(), g.numpy(), beta.numpy(),
                                        initial_state=want_pool, ssm_state_indices=idx.numpy())
    before = pool.clone()
    o, s = kt.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, inplace_final_state=False,
                                  output_final_state=True, ssm_state_indices=idx)
    torch.testing.assert_close(pool, before, rtol=0, atol=0)
    np.testing.assert_array_equal(s[0].numpy(), want_pool[4])
    np.testing.assert_array_equal(s[2].numpy(), want_pool[1])
    assert not s[1].any()
    o2, s2 = kt.fused_recurrent_kda(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx)
    assert s2 is pool
    np.testing.assert_array_equal(o2.numpy(), want_o)
    np.testing.assert_array_equal(pool.numpy(), want_pool)


def _chunk_args(pool_form, **options):
    """torch.ops.kda.chunk_kda's arguments (its schema's order)."""
    q, k, v, g, beta = tensors(T=7, seed=2)
    a = dict(q=q, k=k, v=v, g=g, beta=beta, scale=0.3, initial_state=torch.randn(2, H, K, K),
             output_final_state=True, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
             use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False, lower_bound=None,
             state_v_first=False, cu_seqlens=torch.tensor([0, 3, 7]), A_log=None, dt_bias=None, chunk_size=64,
             state_indices=None, return_intermediate_states=False, kernel="reference")
    if pool_form:
        a.update(scale=None, initial_state=torch.randn(3, H, K, K), use_qk_l2norm_in_kernel=True,
                 state_indices=torch.tensor([2, 0], dtype=torch.int32), kernel="auto")
    a.update(options)
    return tuple(a.values())


@pytest.mark.parametrize("pool_form", [False, True], ids=["contiguous", "pool"])
def test_opcheck_chunk_kda(pool_form):
    torch.library.opcheck(torch.ops.kda.chunk_kda.default, _chunk_args(pool_form))


def test_opcheck_chunk_kda_fla_options():
    # fla's options through the op: beta logits (2 sigmoid), V-first states, chunk_size 32.
    torch.library.opcheck(torch.ops.kda.chunk_kda.default,
                          _chunk_args(False, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                                      state_v_first=True, chunk_size=32))


@pytest.mark.parametrize("options", [
    dict(),  # cu_seqlens: NT depends on its values (a data-dependent size in the fake)
    dict(cu_seqlens=None, initial_state=torch.randn(1, H, K, K), state_v_first=True, chunk_size=32),  # static NT
    dict(pool_form=True),
], ids=["varlen", "rows", "pool"])
def test_opcheck_chunk_kda_intermediate_states(options):
    options = dict(options)
    torch.library.opcheck(torch.ops.kda.chunk_kda.default,
                          _chunk_args(options.pop("pool_form", False), return_intermediate_states=True, **options))


def test_intermediate_states_through_the_op_match_numpy():
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 80, H, K, generator=gen).to(torch.bfloat16) for _ in range(3))
    g = -0.1 * torch.rand(1, 80, H, K, generator=gen)
    beta = torch.rand(1, 80, H, generator=gen)
    cu = torch.tensor([0, 33, 33, 80])
    init = torch.randn(3, H, K, K, generator=gen)
    o, s, h = kt.chunk_kda(q, k, v, g, beta, initial_state=init, output_final_state=True, cu_seqlens=cu,
                           return_intermediate_states=True, chunk_size=32)
    want = kda.chunk_kda(q, k, v, g, beta, initial_state=init, output_final_state=True, cu_seqlens=cu.numpy(),
                         return_intermediate_states=True, chunk_size=32)
    assert h.dtype == torch.bfloat16 and h.shape == (1, 2 + 0 + 2, H, K, K)
    for a, b in zip((o, s, h), want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(h[0, 0], init[0].to(torch.bfloat16), rtol=0, atol=0)
    torch.testing.assert_close(h[0, 2], init[2].to(torch.bfloat16), rtol=0, atol=0)
    with pytest.raises(ValueError, match="disable_recompute=False"):
        kt.chunk_kda(q, k, v, g, beta, return_intermediate_states=True, disable_recompute=True)


@pytest.mark.parametrize("varlen", [False, True], ids=["rows", "varlen"])
def test_torch_compile_intermediate_states(varlen):
    # With cu_seqlens the chunk count is a data-dependent size; the graph stays whole (fullgraph).
    torch._dynamo.reset()

    def step(q, k, v, g, beta, cu):
        o, _, h = kt.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, return_intermediate_states=True, chunk_size=32)
        return o + 1, h * 2, h.shape[1]

    q, k, v, g, beta = tensors(B=1, T=70, seed=7)
    cu = torch.tensor([0, 5, 40, 70]) if varlen else None
    want = step(q, k, v, g, beta, cu)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, g, beta, cu)
    assert want[2] == (1 + 2 + 1 if varlen else 3)
    assert got[2] == want[2]
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _recurrent_args(**options):
    """torch.ops.kda.fused_recurrent_kda_fwd's arguments (its schema's order)."""
    q, k, v, g, beta = tensors(B=1, T=3, seed=3)
    a = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=None, dt_bias=None, initial_state=torch.randn(4, H, K, K),
             scale=None, output_final_state=False, inplace_final_state=True, state_v_first=False,
             cu_seqlens=torch.arange(4), ssm_state_indices=torch.tensor([3, -1, 0], dtype=torch.int32),
             num_accepted_tokens=None, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=False,
             use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, kernel="auto")
    a.update(options)
    return tuple(a.values())


def test_opcheck_fused_recurrent_kda_fwd():
    torch.library.opcheck(torch.ops.kda.fused_recurrent_kda_fwd.default, _recurrent_args())
    # Contiguous states, several tokens per sequence, a new final state.
    torch.library.opcheck(torch.ops.kda.fused_recurrent_kda_fwd.default,
                          _recurrent_args(initial_state=torch.randn(2, H, K, K), inplace_final_state=False,
                                          output_final_state=True, cu_seqlens=torch.tensor([0, 1, 3]),
                                          ssm_state_indices=None))
    # 2-D slots and accepted counts (speculative decoding), a state per token out.
    torch.library.opcheck(torch.ops.kda.fused_recurrent_kda_fwd.default,
                          _recurrent_args(cu_seqlens=torch.tensor([0, 2, 3]), inplace_final_state=False,
                                          output_final_state=True,
                                          ssm_state_indices=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32),
                                          num_accepted_tokens=torch.tensor([2, 1], dtype=torch.int32)))


def test_opcheck_gate_in_kernel_bf16():
    q, k, v, g, beta = tensors(T=5, seed=4, dtype=torch.bfloat16)
    args = (q, k, v, g, beta, None, None, True, True, True, False, False, False, None, False, None, -torch.rand(H),
            torch.randn(H * K), 64, None, False, "auto")
    torch.library.opcheck(torch.ops.kda.chunk_kda.default, args)
    # fla's sigmoid gate with a lower bound, without A_log.
    args = (q, k, v, g, beta, None, None, True, True, True, False, False, True, -5.0, False, None, None,
            torch.randn(H * K), 64, None, False, "auto")
    torch.library.opcheck(torch.ops.kda.chunk_kda.default, args)


def test_torch_compile_traces_the_ops():
    def step(q, k, v, g, beta, pool, idx, init):
        o, s = kt.chunk_kda(q, k, v, g, beta, initial_state=init, output_final_state=True)
        o2, _ = kt.fused_recurrent_kda(q[:, :1].transpose(0, 1).contiguous(), k[:, :1].transpose(0, 1).contiguous(),
                                       v[:, :1].transpose(0, 1).contiguous(), g[:, :1].transpose(0, 1).contiguous(),
                                       beta[:, :1].transpose(0, 1).contiguous(), initial_state=pool,
                                       ssm_state_indices=idx)
        return o * 2 + 1, s.sum(), o2

    q, k, v, g, beta = tensors(B=1, T=9, seed=5)
    idx = torch.tensor([1], dtype=torch.int32)
    init = torch.randn(1, H, K, K)
    pool_e, pool_c = torch.zeros(2, H, K, K), torch.zeros(2, H, K, K)
    want = step(q, k, v, g, beta, pool_e, idx, init)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(q, k, v, g, beta, pool_c, idx, init)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(pool_c, pool_e, rtol=0, atol=0)  # the mutation survives compilation
    assert pool_c[1].abs().sum() > 0


def test_bad_arguments_through_the_op():
    q, k, v, g, beta = tensors()
    with pytest.raises(ValueError, match=r"k: expected shape"):
        kt.chunk_kda(q, k[:, :, :1], v, g, beta)
    with pytest.raises(TypeError, match=r"q: dtype must be float32, bfloat16 or float16, got float64"):
        kt.chunk_kda(q.double(), k, v, g, beta)
    with pytest.raises(TypeError, match=r"chunk_kda\(\) got an unexpected keyword argument 'output_final_states'"):
        kt.chunk_kda(q, k, v, g, beta, output_final_states=True)
    with pytest.raises(NotImplementedError, match="cp_context"):
        kt.chunk_kda(q, k, v, g, beta, cp_context=object())
    with pytest.raises(RuntimeError, match="kda is forward-only"):
        kt.chunk_kda(q.requires_grad_(), k, v, g, beta)


def test_layer_and_engine_take_torch_tensors():
    import ml_dtypes

    from golden import golden_set_dir

    path = golden_set_dir("kda-mini")
    d = load_case("kda-mini", "varlen_initstate")
    layer = kda.KimiDeltaAttention.from_pretrained(path, layer=0, dtype="bfloat16")
    x = d["hidden_states"].astype(ml_dtypes.bfloat16)
    want = layer.forward(x, d["cu_seqlens"], d["initial_recurrent_state"], d["initial_conv_state"].astype(x.dtype))
    xt = torch.from_numpy(d["hidden_states"]).to(torch.bfloat16)
    got = layer.forward(xt, torch.from_numpy(d["cu_seqlens"]), torch.from_numpy(d["initial_recurrent_state"]),
                        torch.from_numpy(d["initial_conv_state"]).to(torch.bfloat16))
    assert [g.dtype for g in got] == [torch.bfloat16, torch.float32, torch.bfloat16]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.float().numpy(), w.astype(np.float32))
    eng = kda.Engine(path, max_running=2, dtype="bfloat16")
    rid = eng.submit(xt[:10], decode_tokens=2)
    r = eng.run()[rid]
    assert isinstance(r.out, torch.Tensor) and r.out.dtype == torch.bfloat16 and r.out.shape == (10, 512)
