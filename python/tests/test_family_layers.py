"""kda's layers of eight delta-rule families, Qwen3-Next, Qwen3.5, Qwen3.5-MoE, GLM-5 Next, Bailing hybrid,
OLMo hybrid, Lara-Mini and Qwen4-exp (kda.Qwen3NextGatedDeltaNet, kda.Qwen3_5GatedDeltaNet for both Qwen3.5
families, kda.Glm5NextTextLinearAttention, kda.BailingHybridDeltaAttention, kda.OlmoHybridGatedDeltaNet,
kda.LaraMiniGatedDeltaNet, kda.Qwen4ExpTextGatedDeltaNet) against transformers' own modules (5.25.0, their
torch route, fp32): the first linear-attention module of a tiny random model of each family
(hf_families.py), its weights redrawn so projections, gates (KDA's lower-bound gate down to -5, OLMo's
beta up to 2) and the norm are non-trivial, saved as a checkpoint in the tensor names of the family's
original checkpoints (hf_layers.py: the four Qwen families' are transformers' own; GLM-5 Next's and Bailing's
flat forget-gate tensors and q/k/v convs, Bailing's attention.* prefix and dense output projection, OLMo's
q/k/v convs, Lara-Mini's fused in_proj and out_norm), which transformers' own loading takes back into the
same module. For every family: the config read (the tiny model's shapes, the layer's variant settings, its
class) and every other layer class refusing the checkpoint; prefill without a cache, then prefill and five
decode steps through transformers' cache against kda's layer with its states chained and kda's engine
(chunked prefill + decode), every output and the final recurrent and conv states to the fp32 rule (design
§5); packed sequences against each alone; a missing tensor named, and transformers' runtime names refused
where they are not the checkpoints'. Then the config variants (no gate bound, Bailing's unsafe gate, OLMo
without negative eigenvalues, Qwen4-exp's silu gate from hidden_act), the nested configs with the
multimodal key prefix (Qwen4-exp's composite config, Qwen3.5's text_config) and GLM-5 Next's flat text
config, the alternative tensor shapes. (The config reader's refusals: test_gdn_layers.py.)"""

from __future__ import annotations

import json
import re

import hf_families

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kda  # noqa: E402
from golden import check_f32, check_state_f32, read_safetensors, write_safetensors  # noqa: E402
from hf_layers import check_layer_decode, check_layer_prefill, TinyLayer  # noqa: E402

# hf_families family: (kda class, config.json model_type: the text model's, kda's family: the class's)
FAMILIES = {
    "qwen3_next": ("Qwen3NextGatedDeltaNet", "qwen3_next", "qwen3_next"),
    "qwen3_5": ("Qwen3_5GatedDeltaNet", "qwen3_5_text", "qwen3_5_text"),
    "qwen3_5_moe": ("Qwen3_5GatedDeltaNet", "qwen3_5_moe_text", "qwen3_5_text"),
    "glm5_next": ("Glm5NextTextLinearAttention", "glm5_next_text", "glm5_next_text"),
    "bailing_hybrid": ("BailingHybridDeltaAttention", "bailing_hybrid", "bailing_hybrid"),
    "olmo_hybrid": ("OlmoHybridGatedDeltaNet", "olmo_hybrid", "olmo_hybrid"),
    "lara_mini": ("LaraMiniGatedDeltaNet", "lara_mini", "lara_mini"),
    "qwen4_exp": ("Qwen4ExpTextGatedDeltaNet", "qwen4_exp_text", "qwen4_exp_text"),
}
# The tiny models' shapes (hf_families.py; hidden 64, conv 4, rms_norm_eps 1e-6 in all):
# family: (layers, H key heads, HV value heads, K, V)
SHAPES = {
    "qwen3_next": (2, 2, 4, 16, 16),
    "qwen3_5": (2, 2, 4, 16, 16),
    "qwen3_5_moe": (2, 2, 4, 16, 16),
    "glm5_next": (2, 4, 4, 16, 16),
    "bailing_hybrid": (2, 4, 4, 32, 32),
    "olmo_hybrid": (2, 2, 2, 16, 32),
    "lara_mini": (3, 2, 4, 16, 16),
    "qwen4_exp": (2, 2, 4, 16, 16),
}
KERNELS = ("reference", "auto")
T, DECODE = 37, 5  # prefill tokens, decode steps


def layer_class(family: str) -> type:
    return getattr(kda, FAMILIES[family][0])


@pytest.fixture(scope="module", params=list(FAMILIES))
def tiny(request, tmp_path_factory):
    return TinyLayer(request.param, tmp_path_factory.mktemp("family"))


def kda_layer(path, kernel="auto", cls=None):
    return (cls or kda.DeltaRuleLayer).from_pretrained(path, dtype="float32", kernel=kernel)


def test_checkpoint_names_load_in_transformers(tiny, tmp_path):
    # The whole model as transformers saves it, layer 0's tensors replaced by ours: transformers' loading
    # (its conversion_mapping) makes the same module of them. (transformers 5.25 saves OLMo's q/k/v convs
    # as three equal parts, wrong when V != K; its loading splits nothing, so ours load right.)
    tiny.model.save_pretrained(tmp_path)
    saved = read_safetensors(tmp_path / "model.safetensors")
    assert {k for k in saved if k.startswith(tiny.prefix)} == set(tiny.tensors)
    write_safetensors(tmp_path / "model.safetensors",
                      {k: v for k, v in saved.items() if not k.startswith(tiny.prefix)} | tiny.tensors)
    loaded = type(tiny.model).from_pretrained(tmp_path, dtype=torch.float32)
    module = next(m for m in loaded.modules() if type(m) is type(tiny.module))
    want = tiny.module.state_dict()
    got = module.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


# Not Qwen3-Next: on these T tokens its beta stays within (0.12, 0.85).
@pytest.mark.parametrize("tiny", [f for f in FAMILIES if f != "qwen3_next"], indirect=True)
def test_the_draws_reach_the_gate_and_beta_ranges(tiny):
    # What the parity tests below claim to cover, on their inputs (transformers' own intermediates).
    m = tiny.module
    with torch.no_grad():
        x = torch.from_numpy(tiny.inputs(T))[None]
        if hasattr(m, "forget_gate"):  # KDA: g = -5 sigmoid(exp(A_log) (f + dt_bias)), per key dimension
            g = m.forget_gate(x)
            assert g.shape == (1, T, tiny.H, tiny.K)
            assert -5.0 < g.min() < -4.99 and -1e-4 < g.max() < 0
            assert (g < -4.5).float().mean() > 0.05 and (g > -0.05).float().mean() > 0.2
            beta = torch.sigmoid(m.b_proj(x))
        else:  # GDN: g = -exp(A_log) softplus(a + dt_bias), per value head
            b = m.b_proj(x) if hasattr(m, "b_proj") else m.in_proj_b(x)
            beta = torch.sigmoid(b) * (2.0 if getattr(m, "allow_neg_eigval", False) else 1.0)
    if tiny.family == "olmo_hybrid":
        assert beta.max() > 1.9 and beta.min() < 0.1
    else:
        assert beta.max() > 0.9 and beta.min() < 0.1


def test_config_and_layer_class(tiny):
    cls = layer_class(tiny.family)
    _, model_type, family = FAMILIES[tiny.family]
    text = tiny.config.get_text_config()
    cfg = kda.model_config(tiny.path)
    assert cfg["model_type"] == model_type == text.model_type
    assert cfg["family"] == family == cls.model_types[0] and cfg["layer_class"] == cls.__name__
    # The shapes of transformers' module, and kda's reading of config.json. rms_norm_eps: config.json's
    # (OLMo's layer norm uses 1e-5 whatever it says: the parity tests check that)
    layers, H, HV, K, V = SHAPES[tiny.family]
    assert (text.hidden_size, text.num_hidden_layers, tiny.H, tiny.HV, tiny.K, tiny.V, tiny.W, text.rms_norm_eps) == (
        64, layers, H, HV, K, V, 4, 1e-6)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_k_heads"], cfg["num_v_heads"], cfg["head_k_dim"],
            cfg["head_v_dim"], cfg["conv_size"], cfg["rms_norm_eps"], cfg["linear_layers"]) == (
        64, layers, H, HV, K, V, 4, 1e-6, [0])
    # The layer's variant settings as the family derives them (tiny_model's configs: hf_families.py).
    is_kda = tiny.family in ("glm5_next", "bailing_hybrid")
    assert cfg["decay"] == ("per_key_dim" if is_kda else "per_value_head")
    assert cfg["output_gate"] == ("sigmoid" if is_kda or tiny.family == "qwen4_exp" else "silu")
    assert cfg["gate_lower_bound"] == (-5.0 if is_kda else None)
    assert cfg["beta_scale"] == (2.0 if tiny.family == "olmo_hybrid" else 1.0)
    assert cfg["norm_eps"] == (1e-5 if tiny.family == "olmo_hybrid" else text.rms_norm_eps)
    L = kda_layer(tiny.path)
    assert type(L) is cls and isinstance(L, kda.DeltaRuleLayer)
    assert (L.model_type, L.layer_class, L.hidden_size, L.num_k_heads, L.num_v_heads, L.head_k_dim, L.head_v_dim,
            L.conv_size, L.dtype) == (family, cls.__name__, 64, H, HV, K, V, 4, "float32")
    assert type(kda_layer(tiny.path, cls=cls)) is cls
    others = sorted({kda.KimiDeltaAttention, *map(layer_class, FAMILIES)} - {cls}, key=lambda c: c.__name__)
    assert len(others) == 7
    for wrong in others:
        with pytest.raises(ValueError, match=rf"model_type '{model_type}' has {cls.__name__} layers, not "
                                             rf"{wrong.__name__}: use kda\.{cls.__name__}\.from_pretrained"):
            wrong.from_pretrained(tiny.path, dtype="float32")
    for full in range(1, text.num_hidden_layers):  # full, indexed or sliding-window attention
        with pytest.raises(ValueError, match=f"layer {full}"):
            kda.DeltaRuleLayer.from_pretrained(tiny.path, layer=full, dtype="float32")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("length", [T, 130], ids=lambda t: f"T{t}")
def test_prefill_matches_transformers(tiny, kernel, length):
    check_layer_prefill(tiny, kda_layer(tiny.path, kernel), length, (1, tiny.HV, tiny.K, tiny.V))


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_through_the_layer_matches_transformers_cache(tiny, kernel):
    check_layer_decode(tiny, kda_layer(tiny.path, kernel), T, DECODE)


@pytest.mark.parametrize("kernel", KERNELS)
def test_engine_prefill_and_decode_match_transformers_cache(tiny, kernel):
    x = tiny.inputs(T + DECODE, seed=3)
    want, want_states = tiny.hf_prefill_then_decode(x, T)
    eng = kda.Engine(tiny.path, max_running=2, prefill_chunk=16, dtype="float32", kernel=kernel)
    cls = layer_class(tiny.family)
    assert (eng.model_type, eng.layer_class, eng.num_layers, eng.layer_ids) == (
        FAMILIES[tiny.family][2], cls.__name__, 1, [0])
    a = eng.submit(x, decode_tokens=DECODE)
    b = eng.submit(x[:T])  # the prefill alone, beside it
    r = eng.run()
    assert eng.failed == {} and sorted(r) == [a, b]
    check_f32(r[a].out, want, what="engine out (chunked prefill, decode)")
    check_state_f32(r[a].final_recurrent_state, want_states[-1][0], what="engine recurrent state")
    check_state_f32(r[a].final_conv_state, want_states[-1][1], what="engine conv state")
    check_f32(r[b].out, want[:T], what="engine prefill out")
    check_state_f32(r[b].final_recurrent_state, want_states[0][0], what="engine prefill recurrent state")
    check_state_f32(r[b].final_conv_state, want_states[0][1], what="engine prefill conv state")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("seeded", [False, True], ids=["zero", "initstate"])
def test_packed_batch_equals_each_sequence_alone(tiny, kernel, seeded):
    lens = [T, 11]
    x = tiny.inputs(sum(lens), seed=4)
    cu = np.array([0, lens[0], sum(lens)], np.int64)
    rng = np.random.default_rng(5)
    rec0 = (0.5 * rng.standard_normal((2, tiny.HV, tiny.K, tiny.V))).astype(np.float32) if seeded else None
    conv0 = rng.standard_normal((2, tiny.W - 1, tiny.C)).astype(np.float32) if seeded else None
    L = kda_layer(tiny.path, kernel)
    out, rec, conv = L(x, cu, rec0, conv0)
    assert rec.shape == (2, tiny.HV, tiny.K, tiny.V) and conv.shape == (2, tiny.W - 1, tiny.C)
    for n in range(2):
        sl = slice(cu[n], cu[n + 1])
        one = L(x[sl], None, None if rec0 is None else rec0[n:n + 1], None if conv0 is None else conv0[n:n + 1])
        check_f32(out[sl], one[0], what=f"sequence {n} out")
        check_state_f32(rec[n:n + 1], one[1], what=f"sequence {n} recurrent state")
        check_state_f32(conv[n:n + 1], one[2], what=f"sequence {n} conv state")
        if not seeded:  # and transformers' on that sequence alone
            check_f32(out[sl], tiny.hf(x[sl]), what=f"sequence {n} against transformers")


def _check_prefill_and_decode(tiny, path, what: str) -> None:
    """kda's layer at ``path`` against the module: a prefill, then two decode steps, states chained."""
    x = tiny.inputs(T + 2, seed=6)
    want, want_states = tiny.hf_prefill_then_decode(x, T)
    L = kda_layer(path)
    out, rec, conv = L(x[:T])
    check_f32(out, want[:T], what=f"{what}: prefill out")
    for t in range(T, T + 2):
        out, rec, conv = L(x[t:t + 1], None, rec, conv)
        check_f32(out, want[t:t + 1], what=f"{what}: decode step {t - T}")
    check_state_f32(rec, want_states[-1][0], what=f"{what}: recurrent state")
    check_state_f32(conv, want_states[-1][1], what=f"{what}: conv state")


def _glm5_no_bound(tiny):  # linear_lower_bound null: Kimi's softplus gate
    tiny.config.text_config.linear_lower_bound = None
    tiny.module.forget_gate.safe_gate_lower_bound = None


def _bailing_unsafe_gate(tiny):  # kda_safe_gate false: the softplus gate
    tiny.config.kda_safe_gate = False
    tiny.module.forget_gate.safe_gate = False


def _olmo_positive_beta(tiny):  # linear_allow_neg_eigval false: beta = sigmoid(b)
    tiny.config.linear_allow_neg_eigval = False
    tiny.module.allow_neg_eigval = False


def _qwen4_gate_from_hidden_act(tiny):  # output_gate_type null: hidden_act's silu gates the norm
    tiny.config.output_gate_type = None
    tiny.module.norm.activation = tiny.config.hidden_act
    assert tiny.module.norm.activation == "silu"


@pytest.mark.parametrize("family,variant", [
    ("glm5_next", _glm5_no_bound),
    ("bailing_hybrid", _bailing_unsafe_gate),
    ("olmo_hybrid", _olmo_positive_beta),
    ("qwen4_exp", _qwen4_gate_from_hidden_act),
], ids=lambda v: v if isinstance(v, str) else v.__name__.lstrip("_"))
def test_config_variants_match_transformers(tmp_path, family, variant):
    tiny = TinyLayer(family, tmp_path)
    variant(tiny)
    (tiny.path / "config.json").write_text(tiny.config.to_json_string(use_diff=False))
    _check_prefill_and_decode(tiny, tiny.path, variant.__name__)


def _relocated(tiny, root, name: str, config: dict, prefix: str, reshape=None):
    """tiny's tensors under ``prefix`` instead of its own (``reshape``: name -> new shape), with ``config``."""
    path = root / name
    path.mkdir()
    tensors = {}
    for k, v in tiny.tensors.items():
        rest = k[len(tiny.prefix):]
        tensors[prefix + rest] = v.reshape((reshape or {}).get(rest, v.shape))
    TinyLayer.write(path, json.dumps(config), tensors)
    return path


def _qwen4_composite(tiny):
    """Qwen4-exp's own checkpoints: its composite config (model_type qwen4_exp, the text model under
    text_config), layers under model.language_model."""
    config = json.loads(transformers.Qwen4ExpConfig(text_config=tiny.config.to_dict()).to_json_string(use_diff=False))
    assert config["model_type"] == "qwen4_exp" and config["text_config"]["model_type"] == "qwen4_exp_text"
    return config, "model.language_model.layers.0.linear_attn."


def _qwen3_5_nested(tiny):
    """Qwen3.5's own checkpoints: config.json with the text model under text_config (model_type qwen3_5), the
    text layers under model.language_model.layers.{i}."""
    text = json.loads(tiny.config.to_json_string(use_diff=False))
    return {"model_type": "qwen3_5", "text_config": text}, "model.language_model.layers.0.linear_attn."


def _glm5_flat(tiny):
    """GLM-5 Next's text model alone, read flat (model_type glm5_next_text), layers under model."""
    flat = json.loads(tiny.config.text_config.to_json_string(use_diff=False))
    assert flat["model_type"] == "glm5_next_text"
    return flat, "model.layers.0.self_attn."


# family: its checkpoints' config.json and layer-0 prefix
LAYOUTS = {"qwen4_exp": _qwen4_composite, "qwen3_5": _qwen3_5_nested, "glm5_next": _glm5_flat}


@pytest.mark.parametrize("family", LAYOUTS)
def test_nested_and_flat_configs(tmp_path, family):
    tiny = TinyLayer(family, tmp_path)
    layout = LAYOUTS[family]
    config, prefix = layout(tiny)
    path = _relocated(tiny, tmp_path, layout.__name__, config, prefix)
    name, model_type, kda_family = FAMILIES[family]
    cfg = kda.model_config(path)
    assert (cfg["model_type"], cfg["family"], cfg["linear_layers"]) == (model_type, kda_family, [0])
    cls = getattr(kda, name)
    assert type(kda_layer(path)) is cls and type(kda_layer(path, cls=cls)) is cls
    _check_prefill_and_decode(tiny, path, layout.__name__)


def test_alternative_tensor_shapes(tmp_path):
    # A_log as [1, 1, H, 1] (Kimi-Linear's own checkpoints) and the convs as [rows, W].
    tiny = TinyLayer("bailing_hybrid", tmp_path)
    p, W = tiny.H * tiny.K, tiny.W
    shapes = {"A_log": (1, 1, tiny.H, 1)} | {f"{n}_conv1d.weight": (p, W) for n in "qkv"}
    path = _relocated(tiny, tmp_path, "shapes", json.loads(tiny.config.to_json_string(use_diff=False)),
                      tiny.prefix, shapes)
    _check_prefill_and_decode(tiny, path, "A_log [1, 1, H, 1], conv [rows, W]")


# family: a tensor of its original checkpoints (left out: the error names it)
MISSING = {
    "qwen3_next": "in_proj_ba.weight",
    "qwen3_5": "dt_bias",
    "qwen3_5_moe": "conv1d.weight",
    "glm5_next": "v_conv1d.weight",
    "bailing_hybrid": "dense.weight",
    "olmo_hybrid": "k_conv1d.weight",
    "lara_mini": "in_proj.weight",
    "qwen4_exp": "in_proj_z.weight",
}


def test_missing_and_unexpected_tensors_are_named(tiny, tmp_path):
    config = tiny.config.to_json_string(use_diff=False)
    key = tiny.prefix + MISSING[tiny.family]
    assert key in tiny.tensors
    path = tmp_path / "missing"
    path.mkdir()
    TinyLayer.write(path, config, {k: v for k, v in tiny.tensors.items() if k != key})
    for load in (kda.DeltaRuleLayer.from_pretrained, layer_class(tiny.family).from_pretrained, kda.Engine):
        with pytest.raises(ValueError, match=f"checkpoint is missing tensor {re.escape(key)}"):
            load(path, dtype="float32")
    # transformers' runtime names (its modules' state_dict) are not the checkpoints': refused, naming one of
    # them (the four Qwen families' are the same names)
    runtime = {tiny.prefix + k: v.detach().numpy() for k, v in tiny.module.state_dict().items()}
    unexpected = sorted(set(runtime) - set(tiny.tensors))
    assert bool(unexpected) == (tiny.family not in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen4_exp"))
    if unexpected:
        path = tmp_path / "runtime_names"
        path.mkdir()
        TinyLayer.write(path, config, runtime)
        with pytest.raises(ValueError, match=rf"checkpoint tensor ({'|'.join(map(re.escape, unexpected))}) is not "
                                             r"a tensor of this layer type \(unexpected key\)"):
            kda.DeltaRuleLayer.from_pretrained(path, dtype="float32")


@pytest.mark.parametrize("family", hf_families.FAMILIES)
def test_checkpoints_saved_by_transformers_load(family, tmp_path):
    # What transformers' own save_pretrained writes (5.25: its config, with Bailing's linear_num_heads /
    # linear_head_dim and head_dim overwritten by the RoPE width; its tensors, with OLMo's q/k/v convs cut into
    # three near-equal parts when V != K) serves as the module it was saved from, to the fp32 rule.
    tiny = TinyLayer(family, tmp_path)
    saved = tmp_path / "saved"
    tiny.model.save_pretrained(saved)
    written = json.loads((saved / "config.json").read_text())
    tensors = read_safetensors(saved / "model.safetensors")
    if family == "bailing_hybrid":
        assert written["head_dim"] != written["linear_head_dim"] == tiny.K
    if family == "olmo_hybrid":
        q_conv = tensors[tiny.prefix + "q_conv1d.weight"]
        assert q_conv.shape[0] == -(-tiny.C // 3) != tiny.H * tiny.K  # torch.chunk's split of C
    _check_prefill_and_decode(tiny, saved, "save_pretrained")
