"""kda's Gated DeltaNet layers (kda.Qwen3NextGatedDeltaNet, kda.Qwen3_5GatedDeltaNet) against transformers'
own modules (5.25.0, their torch route, fp32): the first linear-attention module of a tiny random model of
each family (python/tests/hf_families.py; weights redrawn so projections, gates and the norm are
non-trivial) saved as a checkpoint (config.json from the model's config, the layer's float32 tensors
under model.layers.0.linear_attn.) and loaded by kda. Prefill without a cache, then prefill and five decode
steps through transformers' cache against kda's layer with its states chained and kda's engine (chunked
prefill + decode), every output and the final recurrent and conv states to the fp32 rule (design §5);
packed sequences against each alone; the config read (nested Qwen3.5 configs, the multimodal key
prefix) and the refusals of unsupported model types and bad dimensions."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kda  # noqa: E402
from golden import check_f32, check_state_f32, write_safetensors  # noqa: E402
from hf_layers import TinyLayer  # noqa: E402

# hf_families family: (kda class, config.json model_type)
FAMILIES = {
    "qwen3_next": (kda.Qwen3NextGatedDeltaNet, "qwen3_next"),
    "qwen3_5": (kda.Qwen3_5GatedDeltaNet, "qwen3_5_text"),
    "qwen3_5_moe": (kda.Qwen3_5GatedDeltaNet, "qwen3_5_moe_text"),
}
KERNELS = ("reference", "auto")
T, DECODE = 37, 5  # prefill tokens, decode steps


@pytest.fixture(scope="module", params=list(FAMILIES))
def tiny(request, tmp_path_factory):
    return TinyLayer(request.param, tmp_path_factory.mktemp("gdn"))


def kda_layer(tiny, kernel: str, cls=kda.DeltaRuleLayer):
    return cls.from_pretrained(tiny.path, dtype="float32", kernel=kernel)


def test_checkpoint_config_and_layer_class(tiny):
    cls, model_type = FAMILIES[tiny.family]
    cfg = kda.model_config(tiny.path)
    assert cfg["model_type"] == model_type == tiny.config.model_type
    assert (cfg["family"], cfg["layer_class"]) == (cls.model_types[0], cls.__name__)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_k_heads"], cfg["num_v_heads"], cfg["head_k_dim"],
            cfg["head_v_dim"], cfg["conv_size"], cfg["rms_norm_eps"], cfg["linear_layers"]) == (
        64, 2, 2, 4, 16, 16, 4, 1e-6, [0])
    L = kda_layer(tiny, "auto")
    assert type(L) is cls and isinstance(L, kda.DeltaRuleLayer)
    assert (L.model_type, L.layer_class, L.hidden_size, L.num_k_heads, L.num_v_heads, L.head_k_dim, L.head_v_dim,
            L.conv_size, L.dtype) == (cls.model_types[0], cls.__name__, 64, 2, 4, 16, 16, 4, "float32")
    assert type(cls.from_pretrained(tiny.path, dtype="float32")) is cls
    other = kda.Qwen3_5GatedDeltaNet if cls is kda.Qwen3NextGatedDeltaNet else kda.Qwen3NextGatedDeltaNet
    for wrong in (other, kda.KimiDeltaAttention):
        with pytest.raises(ValueError, match=rf"model_type '{model_type}' has {cls.__name__} layers, not "
                                             rf"{wrong.__name__}: use kda\.{cls.__name__}\.from_pretrained"):
            wrong.from_pretrained(tiny.path, dtype="float32")
    with pytest.raises(ValueError, match="layer 1"):  # full attention
        kda.DeltaRuleLayer.from_pretrained(tiny.path, layer=1, dtype="float32")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("length", [T, 130], ids=lambda t: f"T{t}")
def test_prefill_matches_transformers(tiny, kernel, length):
    x = tiny.inputs(length)
    want = tiny.hf(x)
    assert np.abs(want).max() > 0.1  # outputs of order 1: the 1e-5 rule is a real test
    out, rec, conv = kda_layer(tiny, kernel)(x)
    assert out.dtype == np.float32 and rec.shape == (1, tiny.HV, tiny.K, tiny.V) and conv.shape == (1, 3, tiny.C)
    check_f32(out, want, what=f"{tiny.family} out")
    # With a cache transformers also keeps the final states: the same prefill, its states.
    cache = tiny.new_cache()
    check_f32(tiny.hf(x, cache), want, what="transformers with and without its cache")
    want_rec, want_conv = tiny.hf_states(cache)
    check_state_f32(rec, want_rec, what="recurrent state")
    check_state_f32(conv, want_conv, what="conv state")
    # The conv tail is the last W-1 rows of the raw q|k|v projections.
    np.testing.assert_allclose(conv[0], x[-3:] @ tiny.qkv_weight().T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_through_the_layer_matches_transformers_cache(tiny, kernel):
    x = tiny.inputs(T + DECODE, seed=2)
    want, want_states = tiny.hf_prefill_then_decode(x, T)
    L = kda_layer(tiny, kernel)
    out, rec, conv = L(x[:T])
    check_f32(out, want[:T], what="prefill out")
    for i, t in enumerate(range(T, T + DECODE + 1)):
        check_state_f32(rec, want_states[i][0], what=f"recurrent state after {t} tokens")
        check_state_f32(conv, want_states[i][1], what=f"conv state after {t} tokens")
        if t == T + DECODE:
            break
        out, rec, conv = L(x[t:t + 1], None, rec, conv)
        assert out.shape == (1, tiny.hidden)
        check_f32(out, want[t:t + 1], what=f"decode step {t - T}")
    # The states carry information: decoding from zero states differs.
    assert np.abs(L(x[T:T + 1])[0] - want[T:T + 1]).max() > 1e-3


@pytest.mark.parametrize("kernel", KERNELS)
def test_engine_prefill_and_decode_match_transformers_cache(tiny, kernel):
    x = tiny.inputs(T + DECODE, seed=3)
    want, want_states = tiny.hf_prefill_then_decode(x, T)
    eng = kda.Engine(tiny.path, max_running=2, prefill_chunk=16, dtype="float32", kernel=kernel)
    cls, _ = FAMILIES[tiny.family]
    assert (eng.model_type, eng.layer_class, eng.num_layers, eng.layer_ids) == (
        cls.model_types[0], cls.__name__, 1, [0])
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
    L = kda_layer(tiny, kernel)
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


def test_nested_qwen3_5_config_and_multimodal_prefix(tmp_path):
    # Qwen3.5's own checkpoints: config.json with the text model under text_config (model_type qwen3_5), the
    # text layers under model.language_model.layers.{i}.
    tiny = TinyLayer("qwen3_5", tmp_path)
    nested = tmp_path / "nested"
    nested.mkdir()
    text = json.loads(tiny.config.to_json_string(use_diff=False))
    (nested / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    write_safetensors(nested / "model.safetensors",
                      {"model.language_model." + k[len("model."):]: v for k, v in tiny.tensors.items()})
    cfg = kda.model_config(nested)
    assert (cfg["model_type"], cfg["family"], cfg["linear_layers"]) == ("qwen3_5_text", "qwen3_5_text", [0])
    L = kda.Qwen3_5GatedDeltaNet.from_pretrained(nested, dtype="float32")
    x = tiny.inputs(T)
    check_f32(L(x)[0], tiny.hf(x), what="nested checkpoint out")


def _write_config(path, **fields):
    path.mkdir()
    base = dict(model_type="qwen3_next", hidden_size=64, num_hidden_layers=2, layer_types=["linear_attention",
                "full_attention"], linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                linear_value_head_dim=16, linear_conv_kernel_dim=4, rms_norm_eps=1e-6)
    (path / "config.json").write_text(json.dumps({k: v for k, v in (base | fields).items() if v is not None}))
    return path


@pytest.mark.parametrize("fields,match", [
    (dict(model_type="llama"), r'config.json: unsupported model_type "llama" \(supported: kimi_linear, qwen3_next, '
                               r'.*qwen3_5_text.*\)'),
    (dict(linear_num_value_heads=3), r"config.json: linear_num_value_heads \(3\) must be a multiple of "
                                     r"linear_num_key_heads \(2\)"),
    (dict(linear_key_head_dim=0), r"config.json: linear_key_head_dim must be a positive integer.*got 0"),
    (dict(linear_num_key_heads=None), r"config.json: missing linear_num_key_heads"),
    (dict(layer_types=["full_attention", "full_attention"]), r'layer_types has no "linear_attention" entry'),
], ids=["model_type", "value_heads", "key_dim", "missing", "no_linear_layer"])
def test_unsupported_model_types_and_bad_dims_are_refused(tmp_path, fields, match):
    path = _write_config(tmp_path / "ckpt", **fields)
    for load in (kda.model_config, kda.DeltaRuleLayer.from_pretrained, kda.Qwen3NextGatedDeltaNet.from_pretrained,
                 kda.Engine):
        with pytest.raises(ValueError, match=match):
            load(path)


def test_key_dim_out_of_range_is_refused(tmp_path):
    # The config parses (a positive integer) but the kernels take K <= 256: the loaders refuse it.
    path = _write_config(tmp_path / "ckpt", linear_key_head_dim=512)
    assert kda.model_config(path)["head_k_dim"] == 512
    for load in (kda.DeltaRuleLayer.from_pretrained, kda.Engine):
        with pytest.raises(ValueError, match=r"head dims K 512 and V 16 must be in \[1, 256\]"):
            load(path)
