"""kda inside Hugging Face transformers on the CPU: one call, and a Gated DeltaNet model's linear layers run
kda's kernels (pip install ".[transformers]").

A real checkpoint loads the same way: kda.transformers.enable(), then
AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-Next-80B-A3B-Instruct", dtype=torch.bfloat16). Here a
tiny Qwen3-Next with random weights, saved and loaded, stands in for it (no download).
"""

import tempfile

import torch
from transformers import AutoModelForCausalLM, Qwen3NextConfig

import kda.transformers

kda.transformers.enable()  # before loading; an existing model: kernels.kernelize(model, device="cpu", mode=Mode.INFERENCE)

config = Qwen3NextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=32, layer_types=["linear_attention", "full_attention"],
                         pad_token_id=0, eos_token_id=2)
torch.manual_seed(0)
with tempfile.TemporaryDirectory() as path:
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()

prompt = torch.randint(3, 128, (1, 24))
tokens = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
print("generated:", tokens[0, 24:].tolist())
calls = kda.transformers.call_counts()
print("calls:", calls)
assert all(c["transformers"] == 0 for c in calls.values()), "a call went to transformers' own route"
assert calls["chunk_gated_delta_rule"]["kda"] == 1 and calls["fused_recurrent_gated_delta_rule"]["kda"] == 7
print("ok")
