"""kda: delta-rule linear attention inference on the CPU (Kimi Delta Attention, Gated DeltaNet).

- Kernels with fla's signatures (fla-core 0.6.0; docs/fla-api.md): :func:`chunk_kda` (prefill),
  :func:`fused_recurrent_kda` (the recurrence token by token), :func:`fused_recurrent_kda_fwd` (the
  pool and speculative-decoding entry) and :func:`fused_kda_gate`; for Gated DeltaNet (a scalar gate
  per value head) :func:`chunk_gated_delta_rule`, :func:`fused_recurrent_gated_delta_rule`,
  :func:`fused_recurrent_gated_delta_rule_fwd` (vLLM's) and :func:`fused_gdn_gate`. Over numpy
  arrays (bfloat16 as ``ml_dtypes.bfloat16``) and any CPU array that speaks DLPack (torch tensors,
  JAX arrays), read in place.
- :class:`DeltaRuleLayer`: one delta-rule layer of a checkpoint, by config.json's model_type, and one
  subclass per layer family of kda's registry, named as transformers' module (``LAYER_CLASSES``):
  :class:`KimiDeltaAttention` (kimi_linear), :class:`Glm5NextTextLinearAttention` (glm5_next,
  glm5_next_text), :class:`BailingHybridDeltaAttention` (bailing_hybrid), :class:`Qwen3NextGatedDeltaNet`
  (qwen3_next), :class:`Qwen3_5GatedDeltaNet` (qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text),
  :class:`OlmoHybridGatedDeltaNet` (olmo_hybrid), :class:`LaraMiniGatedDeltaNet` (lara_mini),
  :class:`Qwen4ExpTextGatedDeltaNet` (qwen4_exp, qwen4_exp_text); :func:`model_config` reads a
  checkpoint's config as kda does.
- :class:`Engine`: the state pool and scheduler serving requests through all delta-rule layers.

``import kda.torch`` registers the kernels as torch custom ops; ``import kda.jax`` gives the JAX
kernels. Neither is imported here (both frameworks are optional).
"""

from . import _core
from ._kernels import (
    chunk_gated_delta_rule,
    chunk_kda,
    fused_gdn_gate,
    fused_kda_gate,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_fwd,
    fused_recurrent_kda,
    fused_recurrent_kda_fwd,
)
from ._model import LAYER_CLASSES, DeltaRuleLayer, Engine, RequestResult, model_config

# One layer class per family of kda's registry (KimiDeltaAttention, Qwen3NextGatedDeltaNet, ...).
globals().update(LAYER_CLASSES)

__version__ = "0.1.0"


def set_num_threads(n: int) -> None:
    """Threads of the kernels and layers (OpenMP)."""
    _core.set_num_threads(int(n))


def get_num_threads() -> int:
    return _core.get_num_threads()


def active_kernel(kernel: str = "auto") -> str:
    """What a call with ``kernel`` runs: "reference" or "optimized/<isa>"."""
    return _core.active_kernel(kernel)


def set_kernel_isa(isa: str) -> None:
    """Instruction set of the optimized kernels: "auto" | "generic" | "avx2" | "avx512" | "avx512_shape" (a test variant)."""
    _core.set_kernel_isa(isa)


__all__ = [
    "chunk_kda",
    "fused_recurrent_kda",
    "fused_recurrent_kda_fwd",
    "fused_kda_gate",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_fwd",
    "fused_gdn_gate",
    "DeltaRuleLayer",
    *LAYER_CLASSES,
    "model_config",
    "Engine",
    "RequestResult",
    "set_num_threads",
    "get_num_threads",
    "active_kernel",
    "set_kernel_isa",
]
