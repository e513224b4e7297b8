"""The project's float64 Mamba2 mixer (tools/mamba2_ref.py) checked on its own: against the independent
sets of ../shared/golden (mamba2-mini, mamba2-groups, mamba2-loud) where they exist, every expected tensor
to fp32 storage precision and out_bf16 by the bf16 rule of design §5; and on its generated sets (build/golden,
or written here when the build has none) for internal consistency: a packed batch equals its sequences run
alone, a sequence split in pieces with the states carried equals it run whole, the scan equals its quadratic
(attention-like) form, and the bf16 pipeline stays near the fp32 one. numpy only."""

from __future__ import annotations

import numpy as np
import pytest

from golden import check_bf16, generated_golden_dir, read_safetensors, shared_golden_dir
from mamba_ref import project_reference


ref = project_reference()
SETS = sorted(ref.SETS)
FP32 = ("out_fp32", "final_recurrent_state", "final_conv_state")
INTERMEDIATES = ("z", "x_conv", "B_conv", "C_conv", "dt_raw", "dt", "log_decay", "y_ssm", "y_norm")


def case_names(set_dir):
    return sorted(f.stem for f in set_dir.glob("*.safetensors") if not f.name.startswith("model"))


def max_rel(a, b) -> float:
    """max |a - b| over max |b|."""
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


def run(layer, t, bf16=False):
    return layer.forward(t["hidden_states"], t["cu_seqlens"], t.get("initial_recurrent_state"),
                         t.get("initial_conv_state"), bf16=bf16)


def check_stored(layer, t, fp32_rel=1e-6):
    """The layer reproduces a case's stored tensors: fp32 pipeline and intermediates to fp32 storage precision,
    out_bf16 by the bf16 rule (design §5, against the stored bf16 output and the exact one)."""
    f, b = run(layer, t), run(layer, t, bf16=True)
    got = {"out_fp32": f.out, "final_recurrent_state": f.recurrent_state, "final_conv_state": f.conv_state,
           **f.inter}
    for k in FP32 + INTERMEDIATES:
        assert got[k].shape == t[k].shape, k
        assert max_rel(got[k], t[k]) <= fp32_rel, f"{k}: max relative difference {max_rel(got[k], t[k]):.3g}"
    check_bf16(b.out, t["out_bf16"], t["out_fp32"], what="out_bf16")
    for k, v in (("final_recurrent_state_bf16", b.recurrent_state), ("final_conv_state_bf16", b.conv_state)):
        rel = np.linalg.norm(v - t[k]) / np.linalg.norm(t[k])
        assert rel <= 2e-3, f"{k}: relL2 {rel:.3g}"


# --- the independent sets, where they exist (no test at all otherwise) ----------------------------------

SHARED_CASES = [(s, c) for s in SETS if (shared_golden_dir() / s / "config.json").exists()
                for c in case_names(shared_golden_dir() / s)]

if SHARED_CASES:
    @pytest.mark.parametrize("set_name,case", SHARED_CASES)
    def test_reproduces_shared_set(set_name, case):
        d = shared_golden_dir() / set_name
        check_stored(ref.Layer.from_dir(str(d)), read_safetensors(d / f"{case}.safetensors"))


# --- the generated sets -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """set name -> its directory: build/golden's (ctest's golden_generate), else written here (a few seconds)."""
    dirs = {}
    for s in SETS:
        d = generated_golden_dir() / s
        if not (d / "config.json").exists():
            d = tmp_path_factory.mktemp("golden") / s
            ref.write_set(s, str(d), quiet=True)
        dirs[s] = d
    return dirs


def load(generated, set_name):
    d = generated[set_name]
    return ref.Layer.from_dir(str(d)), {c: read_safetensors(d / f"{c}.safetensors") for c in case_names(d)}


@pytest.mark.parametrize("set_name", SETS)
def test_generated_set_matches_its_writer(generated, set_name):
    """Every case of the set is what the reference computes now (a stale or foreign set fails here)."""
    layer, cases = load(generated, set_name)
    assert sorted(cases) == sorted(name for name, _, _ in ref.SETS[set_name][3])
    for t in cases.values():
        check_stored(layer, t)


@pytest.mark.parametrize("set_name", SETS)
def test_packed_equals_sequences_alone(generated, set_name):
    layer, cases = load(generated, set_name)
    packed = [t for t in cases.values() if len(t["cu_seqlens"]) > 2]
    assert packed
    for t in packed:
        whole = run(layer, t)
        cu = t["cu_seqlens"]
        for n in range(len(cu) - 1):
            s, e = int(cu[n]), int(cu[n + 1])
            init = [t[k][n:n + 1] if k in t else None for k in ("initial_recurrent_state", "initial_conv_state")]
            alone = layer.forward(t["hidden_states"][s:e], [0, e - s], *init)
            assert max_rel(alone.out, whole.out[s:e]) <= 1e-12
            assert max_rel(alone.recurrent_state[0], whole.recurrent_state[n]) <= 1e-12
            assert max_rel(alone.conv_state[0], whole.conv_state[n]) <= 1e-12
            for k, v in alone.inter.items():
                assert max_rel(v, whole.inter[k][s:e]) <= 1e-12, k


@pytest.mark.parametrize("set_name", SETS)
def test_split_sequence_carries_states(generated, set_name):
    """The longest single sequence in pieces (a prefill, one-token decode steps, a piece shorter than the conv
    tail, the rest), each starting from the states the previous one left."""
    layer, cases = load(generated, set_name)
    t = max((t for t in cases.values() if len(t["cu_seqlens"]) == 2), key=lambda t: len(t["hidden_states"]))
    x, T = t["hidden_states"], len(t["hidden_states"])
    whole = run(layer, t)
    cuts = [0, T // 3, T // 3 + 1, T // 3 + 2, T // 3 + 4, T]
    rec, conv = t.get("initial_recurrent_state"), t.get("initial_conv_state")
    outs = []
    for a, b in zip(cuts, cuts[1:]):
        piece = layer.forward(x[a:b], [0, b - a], rec, conv)
        outs.append(piece.out)
        rec, conv = piece.recurrent_state, piece.conv_state
    assert max_rel(np.concatenate(outs), whole.out) <= 1e-12
    assert max_rel(rec, whole.recurrent_state) <= 1e-12
    assert max_rel(conv, whole.conv_state) <= 1e-12


@pytest.mark.parametrize("set_name", SETS)
def test_bf16_pipeline_near_fp32(generated, set_name):
    """The bf16 pipeline's roundings move the output by a few bf16 ulps: relL2 well under 1e-2."""
    _, cases = load(generated, set_name)
    for name, t in cases.items():
        rel = np.linalg.norm(t["out_bf16"] - t["out_fp32"]) / np.linalg.norm(t["out_fp32"])
        assert 1e-4 < rel < 1e-2, f"{name}: relL2 {rel:.3g}"
        assert max_rel(t["final_recurrent_state_bf16"], t["final_recurrent_state"]) < 5e-2, name


def test_scan_equals_quadratic_form():
    """recurrent() against y_t = sum_{s<=t} exp(sum_{s<r<=t} dt_r A) dt_s (C_t . B_s) x_s
    + exp(sum_{r<=t} dt_r A) h_0 C_t + D x_t, with decays down to exp(-100) per step and two groups."""
    rng = np.random.default_rng(7)
    T, H, P, N, G = 23, 4, 3, 5, 2
    x, B, C = rng.normal(size=(T, H, P)), rng.normal(size=(T, G, N)), rng.normal(size=(T, G, N))
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(7.0), (T, H)))
    A, D = -np.arange(1.0, H + 1.0) * 3.0, rng.uniform(0.5, 1.5, H)
    h0 = rng.normal(size=(H, P, N))
    y, h = ref.recurrent(x, dt, A, B, C, D, h0)
    cum = np.cumsum(dt * A, axis=0)  # [T, H]
    group = np.arange(H) // (H // G)
    want = np.zeros((T, H, P))
    for t in range(T):
        for hd in range(H):
            Bh, Ch = B[:, group[hd]], C[:, group[hd]]
            w = np.exp(cum[t, hd] - cum[:t + 1, hd]) * dt[:t + 1, hd] * (Bh[:t + 1] @ Ch[t])  # [t+1]
            want[t, hd] = w @ x[:t + 1, hd] + np.exp(cum[t, hd]) * h0[hd] @ Ch[t] + D[hd] * x[t, hd]
    assert max_rel(y, want) <= 1e-12
    g = group
    h_want = np.exp(cum[-1])[:, None, None] * h0 + np.einsum(
        "th,thp,thn->hpn", np.exp(cum[-1][None, :] - cum) * dt, x, B[:, g])
    assert max_rel(h, h_want) <= 1e-12
