"""Tiny random causal LMs of the transformers (5.25) families with KDA or Gated DeltaNet layers, and of the
Mamba2 model types (``MAMBA2_FAMILIES``: their mixers are kda's SSD layers).

A test helper, no tests: the HF integration tests build these models and compare kda's kernels
against transformers' own route. Each family is one entry of ``_FAMILIES``: its config class, its
causal-LM class and the overrides that make it tiny (hidden 64, 2 or 3 layers, vocab 128, 4 experts
top-2) while keeping its character: a linear (KDA/GDN) layer first, then full attention; GDN value
heads twice the key heads (OLMo hybrid: as many, with V = 2K and negative eigenvalues); GLM-5 Next's
gate lower bound, Bailing's safe gate, Qwen4-Exp's sigmoid output gate. Dropout is 0 and nothing
random runs in the forward. Nested (text_config) families are built over their text config with
their text-only causal LM, except GLM-5 Next, which has no text-only causal LM: its
``Glm5NextForConditionalGeneration`` gets a one-block vision tower (never run for text input).
"""

from __future__ import annotations

import torch
import transformers

FAMILIES = (
    "kimi_linear",
    "glm5_next",
    "bailing_hybrid",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen4_exp",
    "olmo_hybrid",
    "lara_mini",
)

LINEAR, FULL = "linear_attention", "full_attention"

# Shared by every family (the nested families: by the text config). Special ids 0-2: draw test tokens from 3 up.
_COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    attention_dropout=0.0,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_MLA = dict(kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)  # latent attention
_MOE4 = dict(moe_intermediate_size=32, num_experts_per_tok=2)  # + the family's name for 4 experts
# Qwen-style GDN: H 2 key heads, HV 4 value heads (GVA 2), K = V = 16, conv 4; gated full attention.
_GDN = dict(
    layer_types=[LINEAR, FULL],
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)
_QWEN_MOE = dict(**_MOE4, num_experts=4, shared_expert_intermediate_size=32)

# family: (config class, causal-LM class, linear-layer class, config overrides)
_FAMILIES = {
    # KDA: H = HV = 4, K = V = 16; MLA full attention; layer 0 dense MLP, layer 1 MoE.
    "kimi_linear": (
        "KimiLinearConfig",
        "KimiLinearForCausalLM",
        "KimiLinearDeltaAttention",
        dict(
            _MLA,
            intermediate_size=128,
            layer_types=[LINEAR, FULL],
            mlp_layer_types=["dense", "sparse"],
            linear_num_heads=4,
            linear_head_dim=16,
            linear_conv_kernel_dim=4,
            **_MOE4,
            num_local_experts=4,
            num_shared_experts=1,
            n_group=1,
            topk_group=1,
        ),
    ),
    # KDA with the gate's lower bound; NoPE MLA with the DSA indexer (k-pool 4, top-8), 2 mHC streams.
    "glm5_next": (
        "Glm5NextConfig",
        "Glm5NextForConditionalGeneration",
        "Glm5NextTextLinearAttention",
        dict(
            text_config=dict(
                _COMMON | _MLA,
                qk_rope_head_dim=0,
                q_lora_rank=16,
                intermediate_size=128,
                layer_types=[LINEAR, "indexed_attention"],
                mlp_layer_types=["dense", "sparse"],
                linear_num_heads=4,
                linear_head_dim=16,
                linear_conv_kernel_dim=4,
                linear_lower_bound=-5.0,
                **_MOE4,
                n_routed_experts=4,
                n_shared_experts=1,
                index_topk=8,
                index_kpool=4,
                index_n_heads=2,
                index_head_dim=16,
                hc_mult=2,
                bos_token_id=None,
            ),
            vision_config=dict(
                depth=1,
                hidden_size=32,
                num_heads=2,
                intermediate_size=32,
                out_hidden_size=64,
                projection_intermediate_size=32,
            ),
        ),
    ),
    # KDA (heads = num_attention_heads, K = V = head_dim) with the safe gate; MLA with RoPE; no MTP.
    "bailing_hybrid": (
        "BailingHybridConfig",
        "BailingHybridForCausalLM",
        "BailingHybridDeltaAttention",
        dict(
            _MLA,
            qk_rope_head_dim=16,
            # K = V of the KDA layers: the config keeps it as linear_head_dim and sets head_dim to the RoPE
            # width, 16 (what it writes to config.json).
            head_dim=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=128,
            layer_types=[LINEAR, FULL],
            first_k_dense_replace=1,
            short_conv_kernel_size=4,
            kda_safe_gate=True,
            **_MOE4,
            num_local_experts=4,
            num_shared_experts=1,
            n_group=1,
            topk_group=1,
            num_mtp_layers=0,
        ),
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        "Qwen3NextGatedDeltaNet",
        dict(_GDN, **_QWEN_MOE),
    ),
    "qwen3_5": (
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        "Qwen3_5GatedDeltaNet",
        dict(_GDN, intermediate_size=128),  # dense MLP
    ),
    "qwen3_5_moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeGatedDeltaNet",
        dict(_GDN, **_QWEN_MOE),
    ),
    # The output gate takes "sigmoid" or "silu" (unset: hidden_act, silu); the QSA indexer is required by
    # the indexed (full) layer; hyper-connections 2 streams, rank 8; PLE (hashed n-gram embeddings) on
    # the linear layer with a tiny n-gram vocabulary.
    "qwen4_exp": (
        "Qwen4ExpTextConfig",
        "Qwen4ExpForCausalLM",
        "Qwen4ExpTextGatedDeltaNet",
        dict(
            _GDN,
            **_QWEN_MOE,
            layer_types=[LINEAR, "indexed_attention"],
            output_gate_type="sigmoid",
            indexer_n_heads=2,
            indexer_kv_heads=1,
            indexer_head_dim=16,
            indexer_budget=8,
            indexer_compress_ratio=4,
            hc_count=2,
            hc_lowrank=8,
            ple_layer_ids=[1],
            ple_embed_dim=64,
            ngram_size=3,
            heads_per_ngram=2,
            ngram_vocab_size_base=1000,
            split_ngram_parts=1,
        ),
    ),
    # GDN without GVA (H = HV = 2), V = 2K, beta in [0, 2].
    "olmo_hybrid": (
        "OlmoHybridConfig",
        "OlmoHybridForCausalLM",
        "OlmoHybridGatedDeltaNet",
        dict(
            intermediate_size=128,
            layer_types=[LINEAR, FULL],
            linear_num_key_heads=2,
            linear_num_value_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            linear_allow_neg_eigval=True,
        ),
    ),
    # GDN, then sliding-window (8) and full attention.
    "lara_mini": (
        "LaraMiniConfig",
        "LaraMiniForCausalLM",
        "LaraMiniGatedDeltaNet",
        dict(
            _GDN,
            **_QWEN_MOE,
            num_hidden_layers=3,
            layer_types=[LINEAR, "sliding_attention", FULL],
            sliding_window=8,
        ),
    ),
}

LINEAR_CLASSES = frozenset(spec[2] for spec in _FAMILIES.values())

# The Mamba2 model types (kda's SSD layers), each with several groups where its real checkpoints have them, a
# conv of 4, chunks of 16 (transformers' chunked scan then runs over several chunks) and its own layer pattern:
# every layer a mixer (mamba2); mixers beside MLP and attention layers (nemotron_h), beside attention (bamba:
# attn_layer_indices; granitemoehybrid: layer_types, one group as in Granite-4.0-H, its MoE tiny); beside an
# attention block in every layer (falcon_h1: its multipliers all apart from one and its norm before the gate);
# after a shared attention block in a "hybrid" layer (zamba2).
MAMBA2_FAMILIES = ("mamba2", "nemotron_h", "granitemoehybrid", "bamba", "falcon_h1", "zamba2")
_MAMBA2_COMMON = dict(
    vocab_size=128,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)
_ATTENTION = dict(num_attention_heads=2, num_key_value_heads=2, intermediate_size=64, attention_dropout=0.0)
_MAMBA2 = {
    # hidden 64, H 8 heads of P 16 (expand 2), N 16, G 2
    "mamba2": (
        "Mamba2Config",
        "Mamba2ForCausalLM",
        "Mamba2Mixer",
        dict(
            hidden_size=64,
            num_hidden_layers=2,
            num_heads=8,
            head_dim=16,
            expand=2,
            state_size=16,
            n_groups=2,
            conv_kernel=4,
            chunk_size=16,
            layer_norm_epsilon=1e-6,
        ),
    ),
    # hidden 96, H 6 heads of P 24, N 32, G 2; mixer, MLP, attention, mixer
    "nemotron_h": (
        "NemotronHConfig",
        "NemotronHForCausalLM",
        "NemotronHMamba2Mixer",
        dict(
            _ATTENTION,
            hidden_size=96,
            layers_block_type=["linear_attention", "mlp", "full_attention", "linear_attention"],
            head_dim=32,
            mamba_num_heads=6,
            mamba_head_dim=24,
            ssm_state_size=32,
            n_groups=2,
            conv_kernel=4,
            chunk_size=16,
            layer_norm_epsilon=1e-6,
        ),
    ),
    # hidden 128, H 4 heads of P "auto" (expand 1: 32), N 32, G 1; mixer, attention
    "granitemoehybrid": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        "GraniteMoeHybridMambaLayer",
        dict(
            _ATTENTION,
            hidden_size=128,
            num_hidden_layers=2,
            layer_types=["mamba", "attention"],
            shared_intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            mamba_n_heads=4,
            mamba_d_head="auto",
            mamba_expand=1,
            mamba_d_state=32,
            mamba_n_groups=1,
            mamba_d_conv=4,
            mamba_chunk_size=16,
            rms_norm_eps=1e-6,
        ),
    ),
    # hidden 64, H 4 heads of P "auto" (expand 2: 32), N 16, G 2; mixer, attention, mixer
    "bamba": (
        "BambaConfig",
        "BambaForCausalLM",
        "BambaMixer",
        dict(
            _ATTENTION,
            hidden_size=64,
            num_hidden_layers=3,
            attn_layer_indices=[1],
            mamba_n_heads=4,
            mamba_d_head="auto",
            mamba_expand=2,
            mamba_d_state=16,
            mamba_n_groups=2,
            mamba_d_conv=4,
            mamba_chunk_size=16,
            rms_norm_eps=1e-6,
        ),
    ),
    # hidden 64, H 4 heads of P "auto" (mamba_d_ssm 128: 32), N 16, G 2; every layer a mixer beside attention
    "falcon_h1": (
        "FalconH1Config",
        "FalconH1ForCausalLM",
        "FalconH1Mixer",
        dict(
            _ATTENTION,
            hidden_size=64,
            num_hidden_layers=2,
            mamba_d_ssm=128,
            mamba_n_heads=4,
            mamba_d_head="auto",
            mamba_d_state=16,
            mamba_n_groups=2,
            mamba_d_conv=4,
            mamba_chunk_size=16,
            mamba_rms_norm=True,
            mamba_norm_before_gate=True,
            ssm_in_multiplier=0.7,
            ssm_multipliers=[1.3, 0.6, 1.5, 0.8, 1.2],
            rms_norm_eps=1e-6,
        ),
    ),
    # hidden 64, H 4 heads of 32 (expand 2), N 16, G 2; a hybrid layer (the shared attention block, then a
    # mixer under mamba_decoder.mamba.), a mixer layer; the norm's eps 1e-5 fixed
    "zamba2": (
        "Zamba2Config",
        "Zamba2ForCausalLM",
        "Zamba2MambaMixer",
        dict(
            _ATTENTION,
            hidden_size=64,
            num_hidden_layers=2,
            layers_block_type=["hybrid", "mamba"],
            n_mamba_heads=4,
            mamba_expand=2,
            mamba_d_state=16,
            mamba_ngroups=2,
            mamba_d_conv=4,
            chunk_size=16,
            num_mem_blocks=1,
            rms_norm_eps=1e-6,
        ),
    ),
}

MIXER_CLASSES = frozenset(spec[2] for spec in _MAMBA2.values())


def _spec(family: str):
    return _MAMBA2[family] if family in _MAMBA2 else _FAMILIES[family]


def tiny_config(family: str, **overrides):
    """The transformers config of a tiny random causal LM of ``family`` (a delta-rule family or a Mamba2 model
    type), with ``overrides`` on top."""
    config_cls, _, _, fields = _spec(family)
    if family in _MAMBA2:
        kwargs = dict(_MAMBA2_COMMON, **fields)
    else:
        kwargs = dict(fields) if "text_config" in fields else dict(_COMMON, **fields)
    return getattr(transformers, config_cls)(**(kwargs | overrides))


def tiny_model(family: str, seed: int = 0, dtype=torch.float32, **overrides):
    """``family``'s causal LM over :func:`tiny_config`, its weights drawn after ``torch.manual_seed(seed)``,
    in ``dtype`` (the modules the family keeps in float32 stay so), in eval mode."""
    _, model_cls, _, _ = _spec(family)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)._from_config(tiny_config(family, **overrides), dtype=dtype)
    return model.eval()


def linear_layer_modules(model) -> list:
    """The model's KDA / Gated DeltaNet modules, in layer order."""
    return [m for m in model.modules() if type(m).__name__ in LINEAR_CLASSES]


def mixer_modules(model) -> list:
    """The model's Mamba2 mixers, in layer order."""
    return [m for m in model.modules() if type(m).__name__ in MIXER_CLASSES]
