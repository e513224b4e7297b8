"""kda's config reader on Gated DeltaNet configs (Qwen3-Next's fields, written by hand): the refusals of an
unsupported model type, bad dimensions, a missing field and a config without a linear-attention layer, by
kda.model_config, the layer loaders and the engine, each naming the field; and a key head dim the config
reader takes but the kernels do not, refused by the loaders. (The Qwen layers against transformers' modules,
with the nested Qwen3.5 config and its multimodal key prefix: test_family_layers.py.)"""

from __future__ import annotations

import json

import pytest

import kda


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
