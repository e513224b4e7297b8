"""Int8 (Q8_0) projection weights through the Python layer and engine: a layer loaded with
weights="int8" equals the fp32 layer of a checkpoint holding the dequantized weights fp16(d) * q
(exact in fp32), by design §5's fp32 rule; the quantizer is written here from the format's
definition, independently of the C++ one."""

import shutil

import numpy as np
import pytest

import kda
from golden import check_f32, check_state_f32, golden_cases, golden_set_dir, load_case, read_safetensors, write_safetensors

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj", "b_proj")
CASES = [(s, c) for s, c in golden_cases() if s == "kda-mini"]


def dequantized_q8(w: np.ndarray) -> np.ndarray:
    """Q8_0 of a [out, in] weight in blocks of 32 input weights: d = fp16(max|w| / 127) (fp32
    division, nearest even), q = round-half-away(w / d) clamped to +-127 (0 when d = 0); returns d * q."""
    w = w.astype(np.float32)
    blocks = w.reshape(w.shape[0], -1, 32)
    amax = np.max(np.abs(blocks), axis=2, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(d == 0, np.float32(0), blocks / d).astype(np.float64)
    q = np.clip(np.sign(x) * np.floor(np.abs(x) + 0.5), -127, 127)
    return (d * q.astype(np.float32)).reshape(w.shape)


def test_quantizer_on_hand_made_blocks():
    w = np.zeros((2, 32), np.float32)
    w[0, :4] = [127.0, -63.5, 0.5, -0.5]  # d = 1: ties round away from zero
    dq = dequantized_q8(w)
    np.testing.assert_array_equal(dq[0, :4], [127.0, -64.0, 1.0, -1.0])
    np.testing.assert_array_equal(dq[1], 0.0)  # a zero block


@pytest.fixture(scope="module")
def dequantized_checkpoint(tmp_path_factory):
    src = golden_set_dir("kda-mini")
    if not (src / "model.safetensors").exists():
        pytest.skip(f"golden checkpoint missing: {src}")
    dst = tmp_path_factory.mktemp("kda-mini-dequantized")
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = read_safetensors(src / "model.safetensors")
    for name in list(tensors):
        if any(name.endswith(f".{p}.weight") for p in PROJECTIONS):
            tensors[name] = dequantized_q8(tensors[name])
    write_safetensors(dst / "model.safetensors", tensors)
    return dst


@pytest.mark.parametrize("kernel", ["reference", "optimized"])
@pytest.mark.parametrize("set_name,name", CASES, ids=[c for _, c in CASES])
def test_int8_layer_equals_the_layer_on_dequantized_weights(set_name, name, kernel, dequantized_checkpoint):
    d = load_case(set_name, name)
    int8 = kda.KimiDeltaAttention.from_pretrained(golden_set_dir(set_name), layer=0, dtype="float32", kernel=kernel,
                                                  weights="int8")
    dense = kda.KimiDeltaAttention.from_pretrained(dequantized_checkpoint, layer=0, dtype="float32", kernel=kernel)
    assert int8.weights == "int8" and dense.weights == "bf16"
    args = (d["hidden_states"], d["cu_seqlens"], d.get("initial_recurrent_state"), d.get("initial_conv_state"))
    out, rec, conv = int8.forward(*args)
    ref_out, ref_rec, ref_conv = dense.forward(*args)
    check_f32(out, ref_out, what="out")
    check_state_f32(rec, ref_rec, what="recurrent state")
    check_state_f32(conv, ref_conv, what="conv state")
    # Quantization moves the output (the golden output is the checkpoint's own weights').
    assert np.abs(out - d["out_fp32"]).max() > 1e-4


def test_int8_engine_equals_the_layer(dequantized_checkpoint):
    d = load_case("kda-mini", "single_T128")
    x = d["hidden_states"]
    engine = kda.Engine(golden_set_dir("kda-mini"), max_running=2, prefill_chunk=48, dtype="float32", weights="int8")
    assert engine.weights == "int8"
    rid = engine.submit(x, decode_tokens=5)
    res = engine.run()[rid]
    dense = kda.Engine(dequantized_checkpoint, max_running=2, prefill_chunk=48, dtype="float32")
    rid2 = dense.submit(x, decode_tokens=5)
    ref = dense.run()[rid2]
    check_f32(res.out, ref.out, what="out")
    check_state_f32(res.final_recurrent_state, ref.final_recurrent_state, what="recurrent state")


def test_bad_weights_format_is_refused():
    with pytest.raises(ValueError, match="int8"):
        kda.KimiDeltaAttention.from_pretrained(golden_set_dir("kda-mini"), layer=0, dtype="float32", weights="int4")
