"""The layer through the numpy API against every golden case (layer level, design §5), of the KDA
sets (kda-*), the Gated DeltaNet ones (gdn-*: Qwen3-Next and Qwen3.5 layouts) and the delta-rule families'
sets generated at test time (generated/glm5-mini, bailing-mini, olmo-mini, lara-mini, qwen4-mini): the fp32 pipeline to
1e-5 (out_fp32, final states), the bf16 pipeline by the bf16 rule (out_bf16,
final_recurrent_state_bf16, the conv tail rounded once); the layer classes by model type; and the
engine against the layers run one-shot."""

import functools

import ml_dtypes
import numpy as np
import pytest

import kda
from golden import (
    DELTA_RULE_MODEL_TYPES,
    GDN_MODEL_TYPES,
    GENERATED_PREFIX,
    KDA_MODEL_TYPES,
    check_bf16,
    check_f32,
    check_state_f32,
    golden_cases,
    golden_set_dir,
    load_case,
    model_type,
    rounded_bf16,
)

CASES = golden_cases(KDA_MODEL_TYPES + GDN_MODEL_TYPES + DELTA_RULE_MODEL_TYPES)
BF16 = ml_dtypes.bfloat16
# The layer class of each golden set's model_type.
CLASSES = {
    "kimi_linear": kda.KimiDeltaAttention,
    "qwen3_next": kda.Qwen3NextGatedDeltaNet,
    "qwen3_5_text": kda.Qwen3_5GatedDeltaNet,
    "glm5_next": kda.Glm5NextTextLinearAttention,
    "bailing_hybrid": kda.BailingHybridDeltaAttention,
    "olmo_hybrid": kda.OlmoHybridGatedDeltaNet,
    "lara_mini": kda.LaraMiniGatedDeltaNet,
    "qwen4_exp": kda.Qwen4ExpTextGatedDeltaNet,
}


@functools.lru_cache(maxsize=8)
def layer(set_name, dtype, kernel="reference"):
    L = kda.DeltaRuleLayer.from_pretrained(golden_set_dir(set_name), layer=0, dtype=dtype, kernel=kernel)
    want = CLASSES[model_type(golden_set_dir(set_name)) or "kimi_linear"]
    assert type(L) is want, f"{set_name}: {type(L).__name__}, want {want.__name__}"
    return L


def _params(cases):
    # The real shapes are slow under the reference kernels: the optimized ones there.
    return [pytest.param(s, c, id=f"{s}/{c}") for s, c in cases]


@pytest.mark.parametrize("set_name,name", _params(CASES))
def test_fp32_pipeline(set_name, name):
    d = load_case(set_name, name)
    kernel = "optimized" if set_name.startswith(GENERATED_PREFIX) else "reference"
    L = layer(set_name, "float32", kernel)
    out, rec, conv = L.forward(d["hidden_states"], d["cu_seqlens"], d.get("initial_recurrent_state"),
                               d.get("initial_conv_state"))
    assert out.dtype == np.float32 and out.shape == d["out_fp32"].shape
    check_f32(out, d["out_fp32"], what="out")
    check_state_f32(rec, d["final_recurrent_state"], what="recurrent state")
    check_state_f32(conv, d["final_conv_state"], what="conv state")


@pytest.mark.parametrize("set_name,name", _params(CASES))
def test_bf16_pipeline(set_name, name):
    d = load_case(set_name, name)
    kernel = "optimized" if set_name.startswith(GENERATED_PREFIX) else "reference"
    L = layer(set_name, "bfloat16", kernel)
    init_conv = d.get("initial_conv_state")
    out, rec, conv = L.forward(d["hidden_states"].astype(BF16), d["cu_seqlens"], d.get("initial_recurrent_state"),
                               None if init_conv is None else init_conv.astype(BF16))
    assert out.dtype == BF16 and conv.dtype == BF16 and rec.dtype == np.float32
    check_bf16(out.astype(np.float32), d["out_bf16"], d["out_fp32"], what="out")
    check_bf16(rec, d["final_recurrent_state_bf16"], d["final_recurrent_state"], what="recurrent state")
    # The golden tail is the fp32 pipeline's (exact); the reference bf16 pipeline's is that rounded once.
    exact = d["final_conv_state"]
    check_bf16(conv.astype(np.float32), rounded_bf16(exact), exact, what="conv state")


def test_layer_optimized_kernels_and_defaults():
    d = load_case("kda-mini", "varlen_initstate")
    L = kda.KimiDeltaAttention.from_pretrained(golden_set_dir("kda-mini"), dtype="float32")  # first KDA layer
    assert (L.hidden_size, L.num_heads, L.head_dim, L.conv_size, L.dtype) == (512, 4, 128, 4, "float32")
    out, rec, conv = L(d["hidden_states"], d["cu_seqlens"], d["initial_recurrent_state"], d["initial_conv_state"])
    check_f32(out, d["out_fp32"], what="out")
    check_state_f32(rec, d["final_recurrent_state"], what="recurrent state")
    # One sequence without cu_seqlens, from zeros.
    d1 = load_case("kda-mini", "single_T64")
    out1, rec1, conv1 = L.forward(d1["hidden_states"])
    check_f32(out1, d1["out_fp32"], what="out")
    assert rec1.shape == (1, 4, 128, 128) and conv1.shape == (1, 3, 1536)
    assert (L.model_type, L.layer_class, L.num_k_heads, L.num_v_heads, L.head_k_dim, L.head_v_dim) == (
        "kimi_linear", "KimiDeltaAttention", 4, 4, 128, 128)


# set: (class, hidden, H, HV, K, V)
GDN_SETS = {
    "gdn-mini": (kda.Qwen3NextGatedDeltaNet, 256, 4, 8, 32, 32),
    "gdn-gva3": (kda.Qwen3_5GatedDeltaNet, 256, 2, 6, 64, 48),
    "gdn-loud": (kda.Qwen3NextGatedDeltaNet, 512, 2, 4, 128, 128),
}


@pytest.mark.parametrize("set_name", sorted(GDN_SETS))
def test_gdn_layer_classes_optimized_kernels_and_defaults(set_name):
    cls, hidden, H, HV, K, V = GDN_SETS[set_name]
    path = golden_set_dir(set_name)
    case = "loud_varlen_initstate" if set_name == "gdn-loud" else "varlen_initstate"
    d = load_case(set_name, case)
    cfg = kda.model_config(path)
    assert cfg["family"] == cls.model_types[0] and cfg["layer_class"] == cls.__name__
    assert (cfg["hidden_size"], cfg["num_k_heads"], cfg["num_v_heads"], cfg["head_k_dim"], cfg["head_v_dim"],
            cfg["conv_size"], cfg["linear_layers"], cfg["rms_norm_eps"]) == (hidden, H, HV, K, V, 4, [0, 1, 2], 1e-6)
    L = cls.from_pretrained(path, dtype="float32")  # the first linear layer, the optimized kernels
    assert type(L) is cls
    assert (L.model_type, L.layer_class, L.hidden_size, L.num_k_heads, L.num_v_heads, L.head_k_dim, L.head_v_dim,
            L.num_heads, L.head_dim, L.conv_size, L.dtype, L.weights) == (
        cls.model_types[0], cls.__name__, hidden, H, HV, K, V, H, K, 4, "float32", "bf16")
    out, rec, conv = L(d["hidden_states"], d["cu_seqlens"], d["initial_recurrent_state"], d["initial_conv_state"])
    check_f32(out, d["out_fp32"], what="out")
    check_state_f32(rec, d["final_recurrent_state"], what="recurrent state")
    check_state_f32(conv, d["final_conv_state"], what="conv state")
    N = d["cu_seqlens"].size - 1
    assert rec.shape == (N, HV, K, V) and conv.shape == (N, 3, 2 * H * K + HV * V)
    # Another family's class refuses the checkpoint before loading it, naming its model_type and class.
    for other in (kda.KimiDeltaAttention, kda.Qwen3NextGatedDeltaNet, kda.Qwen3_5GatedDeltaNet):
        if other is not cls:
            with pytest.raises(ValueError, match=rf"model_type '{cfg['model_type']}'.*use kda\.{cls.__name__}"):
                other.from_pretrained(path, dtype="float32")
    # The last delta-rule layer by index; the full-attention layer 3 is refused by the C++ loader.
    assert type(kda.DeltaRuleLayer.from_pretrained(path, layer=2, dtype="float32")) is cls
    with pytest.raises(ValueError, match="layer 3"):
        kda.DeltaRuleLayer.from_pretrained(path, layer=3, dtype="float32")


def _one_shot_chain(path, dtype, x, rec0=None, conv0=None):
    """The engine's forward for one request, layer by layer: h += out between layers."""
    ids = kda.Engine(path, max_running=1, dtype=dtype).layer_ids
    h = x
    recs, convs = [], []
    for i, lid in enumerate(ids):
        L = kda.DeltaRuleLayer.from_pretrained(path, layer=lid, dtype=dtype, kernel="reference")
        out, rec, conv = L.forward(h, None, None if rec0 is None else rec0[i:i + 1],
                                   None if conv0 is None else conv0[i:i + 1])
        recs.append(rec[0])
        convs.append(conv[0])
        if i + 1 < len(ids):
            h = (h.astype(np.float32) + out.astype(np.float32)).astype(h.dtype)
    return out, np.stack(recs), np.stack(convs)


@pytest.mark.parametrize("set_name", ["kda-mini", "gdn-mini", "gdn-gva3"])
def test_engine_matches_layers_one_shot(set_name):
    # Requests with chunked prefill, decode steps and more requests than slots, fp32 pipeline.
    path = golden_set_dir(set_name)
    d = load_case(set_name, "varlen_unbalanced_5_17_1_41")
    cu = d["cu_seqlens"]
    x = d["hidden_states"]
    eng = kda.Engine(path, max_running=2, prefill_chunk=7, dtype="float32", kernel="optimized")
    assert eng.num_layers == 3 and eng.layer_ids == [0, 1, 2]
    cfg = kda.model_config(path)
    assert (eng.model_type, eng.layer_class, eng.num_k_heads, eng.num_v_heads, eng.head_k_dim, eng.head_v_dim,
            eng.conv_size) == (cfg["family"], cfg["layer_class"], cfg["num_k_heads"], cfg["num_v_heads"],
                               cfg["head_k_dim"], cfg["head_v_dim"], cfg["conv_size"])
    ids = [eng.submit(x[cu[n]:cu[n + 1]], decode_tokens=3) for n in range(cu.size - 1)]
    results = eng.run()
    assert sorted(results) == ids and eng.failed == {}
    for n, rid in enumerate(ids):
        want_out, want_rec, want_conv = _one_shot_chain(path, "float32", x[cu[n]:cu[n + 1]])
        r = results[rid]
        check_f32(r.out, want_out, what=f"request {rid} out")
        check_state_f32(r.final_recurrent_state, want_rec, what=f"request {rid} recurrent")
        check_state_f32(r.final_conv_state, want_conv, what=f"request {rid} conv")


@pytest.mark.parametrize("set_name", ["kda-mini", "gdn-gva3"])
def test_engine_bf16_with_initial_states(set_name):
    # The bf16 engine in one EXTEND step against the same layers one-shot (the bf16 rule; chunked
    # bf16 prefill is left to the fp32 test above and the C++ serving tests: through three chained
    # layers its rounding flips cascade beyond the one-layer rule).
    path = golden_set_dir(set_name)
    d = load_case(set_name, "single_T128_initstate")
    eng = kda.Engine(path, max_running=4, dtype="bfloat16", kernel="reference")
    L = eng.num_layers
    H, HV, K, V, W = eng.num_k_heads, eng.num_v_heads, eng.head_k_dim, eng.head_v_dim, eng.conv_size
    rng = np.random.default_rng(1)
    rec0 = (0.1 * rng.standard_normal((L, HV, K, V))).astype(np.float32)
    conv0 = (0.1 * rng.standard_normal((L, W - 1, 2 * H * K + HV * V))).astype(BF16)
    x = d["hidden_states"].astype(BF16)
    rid = eng.submit(x, initial_recurrent_state=rec0, initial_conv_state=conv0, request_id=42)
    assert rid == 42
    r = eng.run()[42]
    assert r.out.dtype == BF16 and r.out.shape == x.shape and r.final_conv_state.dtype == BF16
    want_out, want_rec, want_conv = _one_shot_chain(path, "bfloat16", x, rec0, conv0)
    exact_out, exact_rec, _ = _one_shot_chain(path, "float32", x.astype(np.float32), rec0, conv0.astype(np.float32))
    check_bf16(r.out.astype(np.float32), want_out.astype(np.float32), exact_out, what="out")
    check_bf16(r.final_recurrent_state, want_rec, exact_rec, what="recurrent")
    np.testing.assert_array_equal(r.final_conv_state, want_conv)
