"""kda's Mamba2 mixers (the SSD layers of model types granitemoehybrid, nemotron_h, bamba, mamba2, falcon_h1 and
zamba2) against
transformers' own mixer modules (5.25.0, their torch route, fp32): a tiny random model of each type
(hf_families.MAMBA2_FAMILIES: several groups where the type's checkpoints have them, mixers beside MLP and
attention layers), every mixer's weights redrawn so projections, dt, the decay and the gated norm are
non-trivial, written by transformers' own save_pretrained (hf_layers.TinyMixers): its config.json (with
time_step_limit [0.0, {"__float__": "Infinity"}]) and its safetensors (backbone.layers.{i}.mixer. for
nemotron_h and mamba2, model.layers.{i}.mamba. for granitemoehybrid, bamba and falcon_h1, a zamba2 hybrid layer's
model.layers.{i}.mamba_decoder.mamba.) are what kda loads. For every
type: the config read (the mixers' shapes, layers and norm eps as transformers' modules have them) and the layer
class; prefill without a cache and the final recurrent state [H, P, N] and conv tail [W-1, x|B|C] against
transformers' cache; every mixer layer; prefill and five decode steps through transformers' cache against kda's
layer with its states chained and kda's engine (chunked prefill + decode, the mixers chained through the residual
stream); packed sequences against each alone through transformers (its torch route does not keep packed
sequences apart), from zero states and from kda's own states after a prefix against transformers continuing
that prefix through its cache; every output and state to the fp32 rule (design §5). Then a time_step_limit
that binds at both ends (prefill only: transformers' decode step never applies it), the bare Infinity of
older writers, and a missing tensor named; Falcon-H1's other norm forms (none; before the gate) and Zamba2's
clamp (time_step_min, inf) where it binds."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kda  # noqa: E402
from golden import check_f32, check_state_f32, read_safetensors, write_safetensors  # noqa: E402
from hf_families import MAMBA2_FAMILIES  # noqa: E402
from hf_layers import check_layer_decode, check_layer_prefill, TinyMixers  # noqa: E402

# model_type: (kda class: transformers' mixer class, layer-0 prefix in what save_pretrained writes)
FAMILIES = {
    "mamba2": ("Mamba2Mixer", "backbone.layers.0.mixer."),
    "nemotron_h": ("NemotronHMamba2Mixer", "backbone.layers.0.mixer."),
    "granitemoehybrid": ("GraniteMoeHybridMambaLayer", "model.layers.0.mamba."),
    "bamba": ("BambaMixer", "model.layers.0.mamba."),
    "falcon_h1": ("FalconH1Mixer", "model.layers.0.mamba."),
    "zamba2": ("Zamba2MambaMixer", "model.layers.0.mamba_decoder.mamba."),
}
assert tuple(FAMILIES) == MAMBA2_FAMILIES
# The tiny models' shapes (hf_families.py; conv 4, norm eps 1e-6 in all but zamba2's fixed 1e-5):
# type: (hidden, layers, mixer layers, H heads, P head dim, N state size, G groups)
SHAPES = {
    "mamba2": (64, 2, [0, 1], 8, 16, 16, 2),
    "nemotron_h": (96, 4, [0, 3], 6, 24, 32, 2),
    "granitemoehybrid": (128, 2, [0], 4, 32, 32, 1),
    "bamba": (64, 3, [0, 2], 4, 32, 16, 2),
    "falcon_h1": (64, 2, [0, 1], 4, 32, 16, 2),
    "zamba2": (64, 2, [0, 1], 4, 32, 16, 2),
}
EPS = {"zamba2": 1e-5}
LIMITED = [f for f in FAMILIES if f != "zamba2"]  # the types with a time_step_limit field
KERNELS = ("reference", "auto")
T, DECODE = 37, 5  # prefill tokens (three of transformers' 16-token chunks), decode steps
INFINITY = {"__float__": "Infinity"}  # how transformers 5.25 writes float("inf")


@pytest.fixture(scope="module", params=list(FAMILIES))
def tiny(request, tmp_path_factory):
    return TinyMixers(request.param, tmp_path_factory.mktemp("mamba2"))


def kda_layer(path, kernel="auto", layer=None, cls=None):
    return (cls or kda.DeltaRuleLayer).from_pretrained(path, layer=layer, dtype="float32", kernel=kernel)


def test_config_and_layer_class(tiny):
    name, prefix = FAMILIES[tiny.family]
    written = json.loads((tiny.path / "config.json").read_text())
    assert written["model_type"] == tiny.family
    assert written.get("time_step_limit", [0.0, INFINITY]) == [0.0, INFINITY]
    tensors = read_safetensors(tiny.path / "model.safetensors")
    assert {k[len(prefix):] for k in tensors if k.startswith(prefix)} == {
        "in_proj.weight", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D", "norm.weight", "out_proj.weight"}
    assert len(tensors) > 8 * len(tiny.layers)  # the whole model: embeddings, norms, attention, MLP
    # kda's reading against transformers' modules: heads, head dim, state size, groups, conv, eps, the layers.
    hidden, layers, mixers, H, P, N, G = SHAPES[tiny.family]
    eps = EPS.get(tiny.family, 1e-6)
    assert (tiny.hidden, tiny.config.num_hidden_layers, tiny.layers, tiny.H, tiny.P, tiny.N, tiny.G, tiny.W,
            tiny.eps) == (hidden, layers, mixers, H, P, N, G, 4, eps)
    cfg = kda.model_config(tiny.path)
    assert (cfg["model_type"], cfg["family"], cfg["layer_class"]) == (tiny.family, tiny.family, name)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["linear_layers"], cfg["num_k_heads"], cfg["num_v_heads"],
            cfg["head_k_dim"], cfg["head_v_dim"], cfg["conv_size"], cfg["rms_norm_eps"], cfg["norm_eps"]) == (
        hidden, layers, mixers, G, H, N, P, 4, cfg["rms_norm_eps"], pytest.approx(eps))
    cls = getattr(kda, name)
    assert kda.LAYER_CLASSES[name] is cls and cls.model_types == (tiny.family,)
    L = kda_layer(tiny.path)
    assert type(L) is cls and type(kda_layer(tiny.path, cls=cls)) is cls
    assert (L.model_type, L.layer_class, L.hidden_size, L.num_k_heads, L.num_v_heads, L.head_k_dim, L.head_v_dim,
            L.conv_size, L.dtype) == (tiny.family, name, hidden, G, H, N, P, 4, "float32")
    for other in sorted({FAMILIES[f][0] for f in FAMILIES} - {name}) + ["Qwen3NextGatedDeltaNet"]:
        with pytest.raises(ValueError, match=rf"model_type '{tiny.family}' has {name} layers, not {other}: "
                                             rf"use kda\.{name}\.from_pretrained"):
            getattr(kda, other).from_pretrained(tiny.path, dtype="float32")
    for other in sorted(set(range(layers)) - set(mixers)):  # attention and MLP layers
        with pytest.raises(ValueError, match=f"layer {other}"):
            kda_layer(tiny.path, layer=other)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("length", [T, 130], ids=lambda t: f"T{t}")
def test_prefill_matches_transformers(tiny, kernel, length):
    want_rec = check_layer_prefill(tiny, kda_layer(tiny.path, kernel), length, (1, tiny.H, tiny.P, tiny.N))
    assert np.abs(want_rec).max() > 1.0  # states of order 1 or more: the state rule is a real test


def test_every_mixer_layer_matches_its_module(tiny):
    x = tiny.inputs(T, seed=8)
    for k, layer in enumerate(tiny.layers):
        cache = tiny.new_cache()
        want = tiny.hf(x, cache, mixer=k)
        out, rec, conv = kda_layer(tiny.path, layer=layer)(x)
        check_f32(out, want, what=f"layer {layer} out")
        want_rec, want_conv = tiny.hf_states(cache, mixer=k)
        check_state_f32(rec, want_rec, what=f"layer {layer} recurrent state")
        check_state_f32(conv, want_conv, what=f"layer {layer} conv state")


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_through_the_layer_and_the_engine_matches_transformers_cache(tiny, kernel):
    check_layer_decode(tiny, kda_layer(tiny.path, kernel), T, DECODE)
    # The engine runs every mixer on the residual stream (h_{l+1} = h_l + mixer_l(h_l)); transformers' mixers
    # the same way, each through its own cache.
    x = tiny.inputs(T + DECODE, seed=3)
    h, outs, states = x, [], []
    for k in range(len(tiny.layers)):
        out_k, states_k = tiny.hf_prefill_then_decode(h, T, mixer=k)
        outs.append(out_k)
        states.append(states_k)
        h = h + out_k
    eng = kda.Engine(tiny.path, max_running=2, prefill_chunk=16, dtype="float32", kernel=kernel)
    name = FAMILIES[tiny.family][0]
    assert (eng.model_type, eng.layer_class, eng.num_layers, eng.layer_ids) == (
        tiny.family, name, len(tiny.layers), tiny.layers)
    a = eng.submit(x, decode_tokens=DECODE)
    b = eng.submit(x[:T])  # the prefill alone, beside it
    r = eng.run()
    assert eng.failed == {} and sorted(r) == [a, b]
    check_f32(r[a].out, outs[-1], what="engine out (chunked prefill, decode)")
    check_f32(r[b].out, outs[-1][:T], what="engine prefill out")
    for k, layer in enumerate(tiny.layers):
        check_state_f32(r[a].final_recurrent_state[k:k + 1], states[k][-1][0], what=f"layer {layer} recurrent state")
        check_state_f32(r[a].final_conv_state[k:k + 1], states[k][-1][1], what=f"layer {layer} conv state")
        check_state_f32(r[b].final_recurrent_state[k:k + 1], states[k][0][0], what=f"layer {layer} prefill state")
        check_state_f32(r[b].final_conv_state[k:k + 1], states[k][0][1], what=f"layer {layer} prefill conv state")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("seeded", [False, True], ids=["zero", "initstate"])
def test_packed_batch_matches_each_sequence_through_transformers(tiny, kernel, seeded):
    # Initial states: kda's own after a prefix of each sequence; transformers continues that prefix through its
    # cache (its chunked scan from the cached state, its conv over the cached tail).
    lens, prefixes = [T, 11, 20], [9, 16, 3]
    x = tiny.inputs(sum(lens), seed=4)
    pre = [tiny.inputs(p, seed=10 + n) for n, p in enumerate(prefixes)]
    cu = np.cumsum([0, *lens])
    L = kda_layer(tiny.path, kernel)
    rec0 = conv0 = None
    if seeded:
        firsts = [L(p) for p in pre]
        rec0 = np.concatenate([f[1] for f in firsts])
        conv0 = np.concatenate([f[2] for f in firsts])
    out, rec, conv = L(x, cu, rec0, conv0)
    assert rec.shape == (3, tiny.H, tiny.P, tiny.N) and conv.shape == (3, tiny.W - 1, tiny.C)
    for n in range(3):
        sl = slice(cu[n], cu[n + 1])
        cache = tiny.new_cache()
        if seeded:
            tiny.hf(pre[n], cache)
        want = tiny.hf(x[sl], cache)
        want_rec, want_conv = tiny.hf_states(cache)
        check_f32(out[sl], want, what=f"sequence {n} out")
        check_state_f32(rec[n:n + 1], want_rec, what=f"sequence {n} recurrent state")
        check_state_f32(conv[n:n + 1], want_conv, what=f"sequence {n} conv state")
    if seeded:  # the initial states matter
        assert np.abs(out[cu[1]:cu[2]] - L(x[cu[1]:cu[2]])[0]).max() > 1e-3


def check_prefill_and_states(tiny, x):
    """kda's layer over x against transformers' prefill through a fresh cache: the output and both states;
    returns transformers' output."""
    cache = tiny.new_cache()
    want = tiny.hf(x, cache)
    out, rec, conv = kda_layer(tiny.path)(x)
    check_f32(out, want, what="prefill out")
    want_rec, want_conv = tiny.hf_states(cache)
    check_state_f32(rec, want_rec, what="recurrent state")
    check_state_f32(conv, want_conv, what="conv state")
    return want


@pytest.mark.parametrize("family", LIMITED)
def test_a_time_step_limit_that_binds(family, tmp_path):
    # dt = clamp(softplus(dt_raw + dt_bias), 0.3, 1.2) clamps at both ends on these inputs. transformers applies
    # time_step_limit in its chunked scan only (its single-token decode step never does): prefill and the states
    # after it are compared, not decode steps.
    tiny = TinyMixers(family, tmp_path, time_step_limit=(0.3, 1.2))
    assert json.loads((tiny.path / "config.json").read_text())["time_step_limit"] == [0.3, 1.2]
    x = tiny.inputs(T, seed=5)
    dt = tiny.dt(x)
    assert (dt < 0.3).mean() > 0.1 and (dt > 1.2).mean() > 0.1
    want = check_prefill_and_states(tiny, x)
    unclamped = TinyMixers(family, tmp_path, name="unclamped")  # the same draws, time_step_limit (0, inf)
    assert np.abs(unclamped.hf(x) - want).max() > 1e-2


def test_bare_infinity_as_older_writers_wrote_it(tmp_path):
    # transformers before 5.x (Python's json) wrote time_step_limit [0.0, Infinity]: the same layer.
    tiny = TinyMixers("bamba", tmp_path)
    text = (tiny.path / "config.json").read_text()
    tagged = re.search(r'\{\s*"__float__":\s*"Infinity"\s*\}', text)
    assert tagged
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(text[:tagged.start()] + "Infinity" + text[tagged.end():])
    shutil.copy(tiny.path / "model.safetensors", bare / "model.safetensors")
    assert json.loads((bare / "config.json").read_text())["time_step_limit"] == [0.0, float("inf")]
    x = tiny.inputs(T, seed=6)
    check_f32(kda_layer(bare)(x)[0], tiny.hf(x), what="bare Infinity")
    assert kda.model_config(bare) == kda.model_config(tiny.path)


def test_missing_tensor_is_named(tiny, tmp_path):
    prefix = FAMILIES[tiny.family][1]
    tensors = read_safetensors(tiny.path / "model.safetensors")
    shutil.copy(tiny.path / "config.json", tmp_path / "config.json")
    write_safetensors(tmp_path / "model.safetensors", {k: v for k, v in tensors.items() if k != prefix + "D"})
    for load in (kda.DeltaRuleLayer.from_pretrained, getattr(kda, FAMILIES[tiny.family][0]).from_pretrained,
                 kda.Engine):
        with pytest.raises(ValueError, match=f"checkpoint is missing tensor {re.escape(prefix)}D"):
            load(tmp_path, dtype="float32")


@pytest.mark.parametrize("norm", ["gate_only", "gate_then_norm"])
def test_falcon_h1_norm_forms(norm, tmp_path):
    # Falcon-H1 without mamba_rms_norm (y * silu(z), no norm.weight written) and with the norm after the gate;
    # prefill, decode through the cache and packed sequences as for the others.
    tiny = TinyMixers("falcon_h1", tmp_path, mamba_rms_norm=norm != "gate_only", mamba_norm_before_gate=False)
    names = read_safetensors(tiny.path / "model.safetensors")
    assert ("model.layers.0.mamba.norm.weight" in names) == (norm != "gate_only")
    L = kda_layer(tiny.path)
    check_layer_prefill(tiny, L, T, (1, tiny.H, tiny.P, tiny.N))
    check_layer_decode(tiny, L, T, DECODE)
    x = tiny.inputs(T + 11, seed=4)
    out = L(x, np.array([0, T, T + 11]))[0]
    check_f32(out[:T], tiny.hf(x[:T]), what="packed sequence 0")
    check_f32(out[T:], tiny.hf(x[T:]), what="packed sequence 1")


def test_falcon_h1_multipliers_matter(tmp_path):
    # The same draws without the multipliers (all ones) give another layer: kda follows each.
    scaled = TinyMixers("falcon_h1", tmp_path)
    plain = TinyMixers("falcon_h1", tmp_path, name="plain", ssm_in_multiplier=1.0, ssm_multipliers=None)
    x = scaled.inputs(T, seed=5)
    assert np.abs(scaled.hf(x) - plain.hf(x)).max() > 1e-2
    check_f32(kda_layer(plain.path)(x)[0], plain.hf(x), what="multipliers one")
    check_f32(kda_layer(scaled.path)(x)[0], scaled.hf(x), what="multipliers")


def test_zamba2_time_step_min_binds(tmp_path):
    # Zamba2 clamps dt to (time_step_min, inf) in its chunked scan (prefill; its decode step does not): with
    # time_step_min 0.5 the clamp binds on these inputs; prefill and its states compared.
    tiny = TinyMixers("zamba2", tmp_path, time_step_min=0.5)
    x = tiny.inputs(T, seed=5)
    assert (tiny.dt(x) < 0.5).mean() > 0.1
    want = check_prefill_and_states(tiny, x)
    unclamped = TinyMixers("zamba2", tmp_path, name="unclamped", time_step_min=1e-6)
    assert np.abs(unclamped.hf(x) - want).max() > 1e-2
