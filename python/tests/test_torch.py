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
    # The state pool is declared mutated; nothing else is. cu_seqlens_cpu: host ints the fake sizes h from.
    assert "Tensor(a6!)? initial_state" in schema and schema.count("!") == 1
    assert schema.endswith("str kernel, SymInt[]? cu_seqlens_cpu=None) -> (Tensor, Tensor, Tensor)")
    # The recurrent op writes the states and o (out) in place.
    schema = str(torch.ops.kda.fused_recurrent_kda_fwd.default._schema)
    assert "Tensor(a7!)? initial_state" in schema and "Tensor(a21!)? out=None" in schema and schema.count("!") == 2


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
             state_indices=None, return_intermediate_states=False, kernel="reference", cu_seqlens_cpu=None)
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
    dict(cu_seqlens_cpu=[0, 3, 7]),  # cu_seqlens: NT from its host copy
    dict(cu_seqlens=None, initial_state=torch.randn(1, H, K, K), state_v_first=True, chunk_size=32),  # NT from T
    dict(pool_form=True, cu_seqlens_cpu=[0, 3, 7]),
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


def _shapes_of_the_op(record, then):
    """A torch.compile backend that records the shapes the kda::chunk_kda node's fake gives, then compiles
    the graph with the backend ``then``."""
    def backend(gm, inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target in (torch.ops.kda.chunk_kda, torch.ops.kda.chunk_kda.default):
                record.append([tuple(x.shape) for x in n.meta["example_value"]])
        return torch._dynamo.lookup_backend(then)(gm, inputs)

    return backend


@pytest.mark.parametrize("form,compiler", [("rows", "aot_eager"), ("varlen-ints", "aot_eager"),
                                           ("varlen-tensor", "aot_eager"), ("varlen-ints", "inductor")])
def test_torch_compile_intermediate_states(form, compiler):
    # h's chunk count under torch.compile: from T without cu_seqlens, else from cu_seqlens_cpu: Python ints give
    # a static size, a tensor's values are read in the graph (a size in terms of them). The graph stays whole.
    # Inductor compiles C++ for the elementwise ops around the op (about 20 s on a 2-core host, cold).
    torch._dynamo.reset()

    def step(q, k, v, g, beta, cu, cpu):
        o, _, h = kt.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cpu, return_intermediate_states=True,
                               chunk_size=32)
        return o + 1, h * 2, h.shape[1]

    q, k, v, g, beta = tensors(B=1, T=70, seed=7)
    cu = None if form == "rows" else torch.tensor([0, 5, 40, 70])
    cpu = {"rows": None, "varlen-ints": [0, 5, 40, 70], "varlen-tensor": torch.tensor([0, 5, 40, 70])}[form]
    want = step(q, k, v, g, beta, cu, None)  # eager: no host copy needed
    shapes = []
    got = torch.compile(step, backend=_shapes_of_the_op(shapes, compiler), fullgraph=True)(q, k, v, g, beta, cu, cpu)
    assert want[2] == (3 if form == "rows" else 1 + 2 + 1)
    assert got[2] == want[2]
    for a, b in zip(got[:2], want[:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len(shapes) == 1
    h_shape = shapes[0][2]
    if form == "varlen-tensor":
        assert isinstance(h_shape[1], torch.SymInt)  # an expression of the values read in the graph
    else:
        assert h_shape == (1, want[2], H, K, K) and all(isinstance(d, int) for d in h_shape)  # static


def test_torch_compile_intermediate_states_need_cu_seqlens_cpu():
    torch._dynamo.reset()
    q, k, v, g, beta = tensors(B=1, T=20, seed=9)
    cu = torch.tensor([0, 7, 20])

    def step(q, k, v, g, beta, cu, cpu=None):
        return kt.chunk_kda(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=cpu, return_intermediate_states=True)[2]

    assert step(q, k, v, g, beta, cu).shape == (1, 2, H, K, K)  # eager: read from cu_seqlens
    with pytest.raises(RuntimeError, match=r"needs cu_seqlens_cpu= \(cu_seqlens' values on the host"):
        torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, g, beta, cu)
    # Any fake-tensor trace: the fake refuses, naming it.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(x) for x in (q, k, v, g, beta, cu)]
        with pytest.raises(ValueError, match="needs cu_seqlens_cpu="):
            step(*fake)
        assert step(*fake, cpu=[0, 7, 20]).shape == (1, 2, H, K, K)
        with pytest.raises(ValueError, match=r"cu_seqlens_cpu: expected cu_seqlens' 3 values, got 2"):
            step(*fake, cpu=[0, 20])
    # Values that disagree with cu_seqlens: refused when the op runs, eagerly or compiled.
    with pytest.raises(ValueError, match=r"cu_seqlens_cpu: must hold cu_seqlens' values: cu_seqlens_cpu\[1\] = 8, "
                                         r"cu_seqlens\[1\] = 7"):
        step(q, k, v, g, beta, cu, cpu=[0, 8, 20])
    torch._dynamo.reset()
    with pytest.raises(ValueError, match=r"cu_seqlens_cpu\[1\] = 8"):
        torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, g, beta, cu, [0, 8, 20])
    with pytest.raises(ValueError, match="cu_seqlens_cpu: expected a 1-D integer tensor"):
        step(q, k, v, g, beta, cu, cpu=torch.tensor([0.0, 7.0, 20.0]))


def _recurrent_args(**options):
    """torch.ops.kda.fused_recurrent_kda_fwd's arguments (its schema's order)."""
    q, k, v, g, beta = tensors(B=1, T=3, seed=3)
    a = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=None, dt_bias=None, initial_state=torch.randn(4, H, K, K),
             scale=None, output_final_state=False, inplace_final_state=True, state_v_first=False,
             cu_seqlens=torch.arange(4), ssm_state_indices=torch.tensor([3, -1, 0], dtype=torch.int32),
             num_accepted_tokens=None, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=False,
             use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, kernel="auto", out=None)
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
    # o written into out (declared mutated).
    torch.library.opcheck(torch.ops.kda.fused_recurrent_kda_fwd.default,
                          _recurrent_args(out=torch.full((1, 3, H, K), float("nan"))))


@pytest.mark.parametrize("form", ["softplus", "lower_bound", "lower_bound without A_log"])
def test_fused_kda_gate_op(form):
    """The gate as a custom op: opcheck, the numpy entry's values, output_dtype, and a graph without breaks."""
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(2, 3, H, K, generator=gen).to(torch.bfloat16)
    a_log = None if form == "lower_bound without A_log" else torch.randn(H, generator=gen)
    bias = torch.randn(H * K, generator=gen)
    lb = None if form == "softplus" else -5.0
    torch.library.opcheck(torch.ops.kda.fused_kda_gate.default, (g, a_log, bias, lb))
    want = kda.fused_kda_gate(g.float().numpy(), None if a_log is None else a_log.numpy(), bias.numpy(),
                              lower_bound=lb)
    got = kt.fused_kda_gate(g, a_log, bias, lower_bound=lb)
    assert got.dtype == torch.float32 and got.shape == g.shape
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=0, atol=0)
    assert kt.fused_kda_gate(g, a_log, bias, lower_bound=lb, output_dtype=torch.bfloat16).dtype == torch.bfloat16
    compiled = torch.compile(lambda g: kt.fused_kda_gate(g, a_log, bias, lower_bound=lb), backend="eager",
                             fullgraph=True)
    torch.testing.assert_close(compiled(g), got, rtol=0, atol=0)
    if a_log is None:
        with pytest.raises(ValueError, match="A_log is required when lower_bound is not set"):
            kt.fused_kda_gate(g, None, bias)


def test_fused_recurrent_out_is_written_in_place():
    q, k, v, g, beta = tensors(B=2, T=3, seed=10, dtype=torch.float16)
    start = torch.randn(4, H, K, K)
    pools = [start.clone(), start.clone()]
    idx = torch.tensor([3, 0], dtype=torch.int32)
    want_o, _ = kt.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pools[0], ssm_state_indices=idx)
    out = torch.full_like(v, float("nan"))
    ptr = out.data_ptr()
    o, s = kt.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pools[1], ssm_state_indices=idx, out=out)
    assert o is out and o.data_ptr() == ptr and s is pools[1]
    assert torch.equal(out, want_o) and torch.equal(pools[1], pools[0])
    assert out.abs().sum() > 0
    # The op writes o into out itself (no o allocated and copied): its own o result is empty.
    o_op, _ = torch.ops.kda.fused_recurrent_kda_fwd(
        q, k, v, g, beta, None, None, start.clone(), None, False, True, False, None, idx, None, False, False, False,
        False, None, "auto", out=out)
    assert o_op.numel() == 0 and out.data_ptr() == ptr and torch.equal(out, want_o)
    # fla's public entry honours out too (with the pool keywords' defaults: inplace_final_state=True unless given).
    out2 = torch.zeros_like(v)
    h0 = torch.randn(2, H, K, K)
    want2 = kt.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o2, s2 = kt.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, out=out2,
                                    inplace_final_state=False)
    assert o2 is out2 and torch.equal(out2, want2[0]) and torch.equal(s2, want2[1])
    # Under torch.compile the write into out survives functionalization.
    torch._dynamo.reset()

    def step(q, k, v, g, beta, pool, out):
        o, _ = kt.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pool, ssm_state_indices=idx, out=out)
        return o.float() * 2

    pool_e, pool_c, out_c = start.clone(), start.clone(), torch.zeros_like(v)
    want_step = step(q, k, v, g, beta, pool_e, torch.zeros_like(v))
    got_step = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, g, beta, pool_c, out_c)
    assert torch.equal(got_step, want_step) and torch.equal(out_c.float() * 2, want_step)
    assert torch.equal(pool_c, pool_e) and torch.equal(pool_e, pools[0])
    # out must have v's shape and q's dtype; refused by name before anything is written.
    bad = torch.zeros(2, 3, H, K)
    with pytest.raises(ValueError, match=r"fused_recurrent_kda_fwd: out: expected shape \[2, 3, 2, 16\] and dtype "
                                         r"torch.float16"):
        kt.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pools[1], ssm_state_indices=idx, out=bad)
    with pytest.raises(TypeError, match="out: expected a torch tensor"):
        kt.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pools[1], ssm_state_indices=idx,
                                   out=np.zeros((2, 3, H, K), np.float16))
    assert not bad.any()


# --- opcheck over fla's options -------------------------------------------------------------------------

def _operands(B, T, H_, HV, K_, V, dtype, seed, beta_per_value=False, raw_gate=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H_, K_, generator=gen).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H_, K_, generator=gen), dim=-1).to(dtype)
    v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    g = torch.randn(B, T, HV, K_, generator=gen) if raw_gate else -0.2 * torch.rand(B, T, HV, K_, generator=gen)
    beta = torch.rand((B, T, HV, V) if beta_per_value else (B, T, HV), generator=gen)
    return q, k, v, g, beta


# Each case: one of fla's options over a base of 2 packed sequences (2 key heads, K = V = 16); "all" combines them.
OP_CASES = {
    "grouped-heads": dict(HV=4),
    "float16": dict(dtype=torch.float16),
    "k60-v100": dict(K=60, V=100),
    "lower-bound-gate": dict(gate=True),
    "state-v-first": dict(state_v_first=True, K=12, V=20),
    "all": dict(HV=4, dtype=torch.float16, K=60, V=100, gate=True, state_v_first=True),
}


def _case(name, seed, beta_per_value=False):
    c = dict(HV=2, dtype=torch.float32, K=16, V=16, gate=False, state_v_first=False)
    c.update(OP_CASES[name])
    q, k, v, g, beta = _operands(1, 7, 2, c["HV"], c["K"], c["V"], c["dtype"], seed, beta_per_value, c["gate"])
    gen = torch.Generator().manual_seed(seed + 1)
    gate = {}
    if c["gate"]:
        gate = dict(A_log=torch.log(torch.rand(c["HV"], generator=gen) + 1),
                    dt_bias=torch.randn(c["HV"] * c["K"], generator=gen), lower_bound=-3.0)
    inner = (c["V"], c["K"]) if c["state_v_first"] else (c["K"], c["V"])
    return c, (q, k, v, g, beta), gate, inner, gen


@pytest.mark.parametrize("name", OP_CASES)
def test_opcheck_chunk_kda_options(name):
    c, (q, k, v, g, beta), gate, inner, gen = _case(name, seed=40)
    a = dict(q=q, k=k, v=v, g=g, beta=beta, scale=None, initial_state=torch.randn(2, c["HV"], *inner, generator=gen),
             output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=c["gate"],
             use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=c["gate"],
             lower_bound=gate.get("lower_bound"), state_v_first=c["state_v_first"], cu_seqlens=torch.tensor([0, 3, 7]),
             A_log=gate.get("A_log"), dt_bias=gate.get("dt_bias"), chunk_size=32, state_indices=None,
             return_intermediate_states=True, kernel="auto", cu_seqlens_cpu=[0, 3, 7])
    torch.library.opcheck(torch.ops.kda.chunk_kda.default, tuple(a.values()))
    # The op's results are the numpy entry's.
    o, s, h = torch.ops.kda.chunk_kda(*a.values())
    want = kda.chunk_kda(q, k, v, g, beta, initial_state=a["initial_state"], output_final_state=True,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=c["gate"], safe_gate=c["gate"],
                         state_v_first=c["state_v_first"], cu_seqlens=a["cu_seqlens"], chunk_size=32,
                         return_intermediate_states=True, **gate)
    assert o.dtype == c["dtype"] and s.shape == (2, c["HV"], *inner) and h.shape == (1, 2, c["HV"], *inner)
    for x, y in zip((o, s, h), want):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


@pytest.mark.parametrize("name", [*OP_CASES, "beta-per-value"])
def test_opcheck_fused_recurrent_kda_fwd_options(name):
    per_value = name in ("beta-per-value", "all")
    c, (q, k, v, g, beta), gate, inner, gen = _case("grouped-heads" if name == "beta-per-value" else name, seed=41,
                                                     beta_per_value=per_value)
    assert beta.dim() == (4 if per_value else 3)
    # 2-D slots and accepted counts (speculative decoding) into a pool, o into out.
    a = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=gate.get("A_log"), dt_bias=gate.get("dt_bias"),
             initial_state=torch.randn(9, c["HV"], *inner, generator=gen), scale=0.5, output_final_state=False,
             inplace_final_state=True, state_v_first=c["state_v_first"], cu_seqlens=torch.tensor([0, 3, 7]),
             ssm_state_indices=torch.tensor([[0, 1, 2, -1], [3, 4, 5, 6]], dtype=torch.int32),
             num_accepted_tokens=torch.tensor([2, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
             use_gate_in_kernel=c["gate"], use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
             lower_bound=gate.get("lower_bound"), kernel="auto", out=torch.zeros_like(v))
    torch.library.opcheck(torch.ops.kda.fused_recurrent_kda_fwd.default, tuple(a.values()))
    # The op's results are the numpy entry's, pool and out updated in place.
    pool, out = a["initial_state"].clone(), a["out"]
    torch.ops.kda.fused_recurrent_kda_fwd(*a.values())
    want_pool = pool.clone()
    want_o, _ = kda.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=want_pool, scale=0.5,
                                            state_v_first=c["state_v_first"], cu_seqlens=a["cu_seqlens"],
                                            ssm_state_indices=a["ssm_state_indices"],
                                            num_accepted_tokens=a["num_accepted_tokens"],
                                            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=c["gate"], **gate)
    assert out.dtype == c["dtype"] and out.abs().sum() > 0
    torch.testing.assert_close(out, want_o, rtol=0, atol=0)
    torch.testing.assert_close(a["initial_state"], want_pool, rtol=0, atol=0)
    assert not torch.equal(want_pool, pool)


def fused(q, k, v, pad=3):
    """q, k, v as column slices of one fused projection [B, T, 2*H*K + HV*V + pad] (views, read in place)."""
    B, T = q.shape[:2]
    qkv = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2), torch.zeros(B, T, pad, dtype=q.dtype)], dim=-1)
    cols = [0, q[0, 0].numel(), 2 * q[0, 0].numel(), 2 * q[0, 0].numel() + v[0, 0].numel()]
    views = tuple(qkv[..., c0:c1].view(x.shape) for x, c0, c1 in zip((q, k, v), cols[:-1], cols[1:]))
    assert all(not x.is_contiguous() and x.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
               for x in views)
    return views


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_token_strided_qkv_through_the_ops(dtype):
    from kda import _core

    q, k, v, g, beta = tensors(B=2, T=6, seed=8, dtype=dtype)
    fq, fk, fv = fused(q, k, v)
    assert all(_core.reads_in_place(x) for x in (fq, fk, fv))
    h0 = torch.randn(2, H, K, K)
    want = kt.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    got = kt.chunk_kda(fq, fk, fv, g, beta, initial_state=h0, output_final_state=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    pools = [torch.randn(3, H, K, K) for _ in range(2)]
    pools[1].copy_(pools[0])
    idx = torch.tensor([2, 0], dtype=torch.int32)
    o_want, _ = kt.fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=pools[0], ssm_state_indices=idx)
    o_got, _ = kt.fused_recurrent_kda_fwd(fq, fk, fv, g, beta, initial_state=pools[1], ssm_state_indices=idx)
    assert torch.equal(o_got, o_want) and torch.equal(pools[1], pools[0])
    # Another layout (heads transposed) is copied once: the same bits.
    qt = q.transpose(2, 3).contiguous().transpose(2, 3)
    assert not _core.reads_in_place(qt)
    got = kt.chunk_kda(qt, fk, fv, g, beta, initial_state=h0, output_final_state=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_opcheck_token_strided_qkv():
    a = list(_chunk_args(False))
    a[:3] = fused(*a[:3])
    torch.library.opcheck(torch.ops.kda.chunk_kda.default, tuple(a))
    a = list(_recurrent_args())
    a[:3] = fused(*a[:3], pad=5)
    torch.library.opcheck(torch.ops.kda.fused_recurrent_kda_fwd.default, tuple(a))


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
