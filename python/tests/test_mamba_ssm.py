"""Mamba2's SSD scan under mamba_ssm's names (kda.mamba_ssm over numpy and torch, torch.ops.kda) against a
float64 per-token reference of mamba_ssm's semantics (mamba_ref.py), the front ends against each other, the
refusals by name (nothing written; the chunked scan's also through kda.jax), and kda inside transformers'
six Mamba2 families (kda.transformers) against the same models unkernelized, prefill and decode, with kda's
calls counted."""

from __future__ import annotations

import numpy as np
import pytest

import kda.mamba_ssm as ms
from golden import check_f32, check_state_f32
from mamba_ref import inputs, ref_scan, ref_step

torch = pytest.importorskip("torch")
import kda.torch as kt  # noqa: E402


@pytest.mark.parametrize("D", [None, "D", "D2"])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("limit", [(0.0, float("inf")), (0.05, 0.6)])
def test_chunk_scan_matches_the_reference(D, gated, limit):
    a = inputs()
    d = None if D is None else a[D]
    z = a["z"] if gated else None
    out, final = ms.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 256, D=d, z=z,
                                              dt_bias=a["dt_bias"], initial_states=a["init"], dt_softplus=True,
                                              dt_limit=limit, return_final_states=True)
    assert out.dtype == np.float32 and out.shape == a["x"].shape
    for r in range(2):
        y, st = ref_scan(a["x"][r], a["dt"][r], a["A"], a["B"][r], a["C"][r], d, None if z is None else z[r],
                         a["dt_bias"], a["init"][r], True, limit)
        check_f32(out[r], y, what=f"row {r} out")
        check_state_f32(final[r], st[-1], what=f"row {r} final")


def test_chunk_scan_without_softplus_clamps_as_mamba_ssm():
    a = inputs(seed=3)
    out = ms.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 64)  # dt < 0 clamped to 0
    y, _ = ref_scan(a["x"][0], a["dt"][0], a["A"], a["B"][0], a["C"][0])
    check_f32(out[0], y, what="out")


@pytest.mark.parametrize("form", ["cu_seqlens", "seq_idx", "both"])
def test_packed_sequences(form):
    a = inputs(b=1, L=50, seed=1)
    cu = np.array([0, 7, 7, 30, 50])
    seq_idx = np.repeat(np.arange(4), np.diff(cu))[None]
    kw = dict(cu_seqlens=cu if form != "seq_idx" else None, seq_idx=seq_idx if form != "cu_seqlens" else None)
    res = ms.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 16, D=a["D"], dt_bias=a["dt_bias"],
                                       initial_states=a["init"][:1], dt_softplus=True, return_final_states=True,
                                       return_varlen_states=form != "seq_idx", **kw)
    y, st = ref_scan(a["x"][0], a["dt"][0], a["A"], a["B"][0], a["C"][0], a["D"], None, a["dt_bias"], a["init"][0],
                     True, starts=(7, 30))
    check_f32(res[0][0], y, what="out")
    check_state_f32(res[1][0], st[-1], what="final")
    if form != "seq_idx":
        assert res[2].shape == (4, 4, 8, 16)
        check_state_f32(res[2][0], st[6], what="sequence 0 (from the initial state)")
        np.testing.assert_array_equal(res[2][1], 0)  # an empty sequence: zeros
        check_state_f32(res[2][2], st[29], what="sequence 2")
        check_state_f32(res[2][3], st[49], what="sequence 3")


def test_seq_idx_over_several_rows():
    a = inputs(b=2, L=20, seed=2)
    seq_idx = np.array([[0] * 5 + [1] * 15, [0] * 12 + [3] * 8])
    out, final = ms.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 8, initial_states=a["init"],
                                              seq_idx=seq_idx, dt_softplus=True, return_final_states=True)
    for r, cut in enumerate((5, 12)):
        y, st = ref_scan(a["x"][r], a["dt"][r], a["A"], a["B"][r], a["C"][r], state=a["init"][r], softplus_dt=True,
                         starts=(cut,))
        check_f32(out[r], y, what=f"row {r}")
        check_state_f32(final[r], st[-1], what=f"row {r} final")


def test_torch_op_equals_numpy_and_keeps_dtypes():
    a = inputs(seed=4)
    t = {k: torch.from_numpy(v) for k, v in a.items()}
    ref = ms.mamba_chunk_scan_combined(a["x"], a["dt"], a["A"], a["B"], a["C"], 64, D=a["D2"], z=a["z"],
                                       dt_bias=a["dt_bias"], initial_states=a["init"], dt_softplus=True,
                                       return_final_states=True)
    got = kt.mamba_chunk_scan_combined(t["x"], t["dt"], t["A"], t["B"], t["C"], 64, D=t["D2"], z=t["z"],
                                       dt_bias=t["dt_bias"], initial_states=t["init"], dt_softplus=True,
                                       return_final_states=True)
    assert isinstance(got[0], torch.Tensor)
    np.testing.assert_array_equal(got[0].numpy(), ref[0])
    np.testing.assert_array_equal(got[1].numpy(), ref[1])
    bf = kt.mamba_chunk_scan_combined(t["x"].bfloat16(), t["dt"], t["A"], t["B"].bfloat16(), t["C"].bfloat16(), 64,
                                      D=t["D"], dt_bias=t["dt_bias"], dt_softplus=True)
    assert bf.dtype == torch.bfloat16
    x32, b32, c32 = (t[k].bfloat16().float().numpy() for k in ("x", "B", "C"))
    exact = ms.mamba_chunk_scan_combined(x32, a["dt"], a["A"], b32, c32, 64, D=a["D"], dt_bias=a["dt_bias"],
                                         dt_softplus=True)
    # one rounding of the float32 result
    np.testing.assert_array_equal(bf.float().numpy(), torch.from_numpy(exact).bfloat16().float().numpy())


def expanded_step(b=3, H=4, P=8, G=2, N=16, seed=5):
    """A decode step as transformers passes it: dt, A, D, dt_bias expanded from one value per head."""
    a = inputs(b=b, L=1, H=H, P=P, G=G, N=N, seed=seed)
    t = {k: torch.from_numpy(v) for k, v in a.items()}
    return dict(x=t["x"][:, 0], dt=t["dt"][:, 0, :, None].expand(-1, -1, P),
                A=t["A"][:, None, None].expand(-1, P, N), B=t["B"][:, 0], C=t["C"][:, 0],
                D=t["D"][:, None].expand(-1, P), dt_bias=t["dt_bias"][:, None].expand(-1, P), z=t["z"][:, 0]), t["init"]


@pytest.mark.parametrize("front", ["numpy", "torch"])
@pytest.mark.parametrize("tied", [True, False])
def test_state_update_matches_the_reference(front, tied):
    kw, init = expanded_step()
    if not tied:  # values per channel (and A per state dimension): mamba_ssm's general form
        g = torch.Generator().manual_seed(9)
        kw["dt"] = torch.randn(kw["dt"].shape, generator=g)
        kw["A"] = -torch.rand(kw["A"].shape, generator=g)
        kw["dt_bias"] = torch.randn(kw["dt_bias"].shape, generator=g) * 0.3
    np_kw = {k: v.numpy() for k, v in kw.items()}
    y, s = ref_step(init.numpy(), **np_kw, softplus_dt=True)
    state = init.clone() if front == "torch" else init.numpy().copy()
    fn = kt.selective_state_update if front == "torch" else ms.selective_state_update
    out = fn(state, **(kw if front == "torch" else np_kw), dt_softplus=True)
    check_f32(np.asarray(out), y, what="out")
    check_state_f32(np.asarray(state), s, what="state")


def test_state_update_pool_indices_and_padding():
    kw, init = expanded_step(b=2)
    pool = torch.randn(5, *init.shape[1:])
    before = pool.clone()
    out = kt.selective_state_update(pool, **kw, dt_softplus=True, state_batch_indices=torch.tensor([3, -1]))
    y, s = ref_step(before[[3, 3]].numpy(), **{k: v.numpy() for k, v in kw.items()}, softplus_dt=True)
    check_f32(out[0].numpy(), y[0], what="row 0")
    np.testing.assert_array_equal(out[1].numpy(), 0)  # padding: zeros, no state touched
    check_state_f32(pool[3].numpy(), s[0], what="slot 3")
    for i in (0, 1, 2, 4):
        assert torch.equal(pool[i], before[i]), f"slot {i} touched"


def test_state_update_without_heads_and_bf16_state():
    r = np.random.default_rng(7)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    b, dim, N = 2, 12, 8
    state, x, dt, A, B, C = f(b, dim, N), f(b, dim), f(b, dim), -np.abs(f(dim, N)), f(b, N), f(b, N)
    y, s = ref_step(state[:, None], x[:, None], dt[:, None], A[None], B[:, None], C[:, None], softplus_dt=True)
    st = state.copy()
    out = ms.selective_state_update(st, x, dt, A, B, C, dt_softplus=True)
    assert out.shape == (b, dim)
    check_f32(out, y[:, 0], what="out")
    check_state_f32(st, s[:, 0], what="state")
    sb = torch.from_numpy(state).bfloat16()
    start = sb.float().numpy()
    kt.selective_state_update(sb, *(torch.from_numpy(v) for v in (x, dt, A, B, C)), dt_softplus=True)
    _, s16 = ref_step(start[:, None], x[:, None], dt[:, None], A[None], B[:, None], C[:, None],
                      softplus_dt=True)
    np.testing.assert_array_equal(sb.float().numpy(), torch.from_numpy(s16[:, 0].astype(np.float32)).bfloat16()
                                  .float().numpy())


def chunk_args(**change):
    a = inputs(b=1, L=9)
    kw = dict(x=a["x"], dt=a["dt"], A=a["A"], B=a["B"], C=a["C"], chunk_size=64, D=a["D"], dt_bias=a["dt_bias"],
              initial_states=a["init"][:1])
    return kw | change


@pytest.mark.parametrize("change, match", [
    (dict(x=np.zeros((1, 9, 4), np.float32)), "x: expected shape"),
    (dict(x=np.zeros((1, 9, 4, 8), np.int32)), "x: dtype"),
    (dict(dt=np.zeros((1, 9, 3), np.float32)), "dt: expected shape"),
    (dict(A=np.zeros(3, np.float32)), "A: expected shape"),
    (dict(B=np.zeros((1, 9, 3, 16), np.float32), C=np.zeros((1, 9, 3, 16), np.float32)), "B: ngroups = 3"),
    (dict(C=np.zeros((1, 9, 2, 8), np.float32)), "C: expected shape"),
    (dict(D=np.zeros((4, 3), np.float32)), "D: expected shape"),
    (dict(z=np.zeros((1, 9, 4, 7), np.float32)), "z: expected shape"),
    (dict(dt_bias=np.zeros(5, np.float32)), "dt_bias: expected shape"),
    (dict(initial_states=np.zeros((1, 4, 8, 15), np.float32)), "initial_states: expected shape"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(dt_limit=(1.0, 0.5)), "dt_limit"),
    (dict(cu_seqlens=np.array([0, 4, 8])), "cu_seqlens: must rise from 0 to seqlen"),
    (dict(seq_idx=np.array([[0, 0, 1, 1, 0, 0, 0, 0, 0]])), "seq_idx: must not decrease"),
    (dict(seq_idx=np.zeros((1, 9), np.int32), cu_seqlens=np.array([0, 4, 9])), "seq_idx: its sequences"),
    (dict(return_varlen_states=True), "return_varlen_states needs cu_seqlens"),
])
@pytest.mark.parametrize("front", ["numpy", "torch", "jax"])
def test_chunk_refusals_name_the_argument(change, match, front):
    kw = chunk_args(**change)
    fn = ms.mamba_chunk_scan_combined
    if front == "torch":
        kw = {k: torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        fn = kt.mamba_chunk_scan_combined
    elif front == "jax":
        jnp = pytest.importorskip("jax.numpy")
        import kda.jax as kj

        kw = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        fn = kj.mamba_chunk_scan_combined
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        fn(**kw)


@pytest.mark.parametrize("change, match", [
    (dict(x=torch.zeros(3, 4, 7)), "x: expected shape"),
    (dict(dt=torch.zeros(3, 4)), "dt: expected shape"),
    (dict(A=torch.zeros(4, 8)), "A: expected shape"),
    (dict(B=torch.zeros(3, 3, 16), C=torch.zeros(3, 3, 16)), "B: ngroups = 3"),
    (dict(C=torch.zeros(3, 2, 15)), "C: expected shape"),
    (dict(D=torch.zeros(4)), "D: expected shape"),
    (dict(dt_bias=torch.zeros(4, 7)), "dt_bias: expected shape"),
    (dict(z=torch.zeros(3, 4)), "z: expected shape"),
    (dict(state_batch_indices=torch.tensor([0, 1])), "state_batch_indices: expected 3"),
    (dict(state_batch_indices=torch.tensor([0, 1, 3])), "state_batch_indices: must be < 3"),
    (dict(state="transpose"), "state: must be C-contiguous"),
])
def test_state_update_refusals_name_the_argument_and_write_nothing(change, match):
    kw, init = expanded_step()
    state = init.clone()
    if change.get("state") == "transpose":
        state = init.clone().transpose(2, 3).contiguous().transpose(2, 3)
        change = {}
    before = state.clone()
    with pytest.raises((ValueError, TypeError, RuntimeError), match=match):
        kt.selective_state_update(state, **(kw | change), dt_softplus=True)
    assert torch.equal(state, before)


def test_grad_is_refused():
    kw, init = expanded_step()
    kw["x"] = kw["x"].clone().requires_grad_()
    with pytest.raises(RuntimeError, match="x requires grad"):
        ms.selective_state_update(init.clone(), **kw)


# ---------------------------------------------------------------- inside transformers

transformers = pytest.importorskip("transformers")
pytest.importorskip("kernels")
import kda.transformers as ktr  # noqa: E402
from hf_families import MAMBA2_FAMILIES, tiny_model  # noqa: E402
from test_transformers import assert_on_kda, kernelized  # noqa: E402

HOOK_FAMILIES = (*MAMBA2_FAMILIES, "falcon_h1", "zamba2")


@pytest.fixture(scope="module")
def enabled():
    ktr.enable()
    yield
    ktr.disable()


def ids_for(model, batch, length, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.get_output_embeddings().weight.shape[0], (batch, length), generator=g)


def cache_of(output):
    """A model output's cache (mamba2 names it ``cache``, the others ``past_key_values``)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


@pytest.mark.parametrize("family", HOOK_FAMILIES)
def test_transformers_prefill_and_decode_match(family, enabled):
    model = tiny_model(family)
    ids = ids_for(model, 2, 40)  # several of the tiny configs' 16-token chunks
    kern = kernelized(model)
    with torch.no_grad():
        ref = model(ids, use_cache=True)
        ktr.call_counts(reset=True)
        out = kern(ids, use_cache=True)
        assert_on_kda(ktr.call_counts(reset=True), "mamba_chunk_scan_combined")
        check_f32(out.logits.numpy(), ref.logits.numpy(), what=f"{family} prefill logits")
        ref_cache, cache = cache_of(ref), cache_of(out)
        step = ids_for(model, 2, 1, seed=2)
        for i in range(3):
            r = model(step, cache=ref_cache, use_cache=True)
            o = kern(step, cache=cache, use_cache=True)
            check_f32(o.logits.numpy(), r.logits.numpy(), what=f"{family} decode step {i}")
            ref_cache, cache = cache_of(r), cache_of(o)
            step = r.logits[:, -1:].argmax(-1)
        assert_on_kda(ktr.call_counts(reset=True), "selective_state_update")
