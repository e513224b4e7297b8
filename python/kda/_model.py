"""One delta-rule layer of a checkpoint (the KDA layers of Kimi-Linear, GLM-5 Next and Bailing hybrid; the Gated
DeltaNet layers of Qwen3-Next, Qwen3.5, OLMo hybrid, Lara-Mini and Qwen4-exp) and the serving engine over all
its delta-rule layers."""

from __future__ import annotations

import itertools
import os
from typing import NamedTuple

import numpy as np

from . import _core
from ._arrays import BF16, for_core, from_core, int_array, np_dtype, shape_of


def model_config(path) -> dict:
    """config.json of the checkpoint directory ``path`` as kda reads it: ``model_type`` (the text model's:
    "kimi_linear", "glm5_next_text", "bailing_hybrid", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
    "olmo_hybrid", "lara_mini", "qwen4_exp_text"), ``family`` (the model type of its layer family, the
    first model_type of a :class:`DeltaRuleLayer` subclass), ``layer_class`` (the transformers class
    of its delta-rule layers), ``hidden_size``, ``num_hidden_layers``, ``num_k_heads`` (H),
    ``num_v_heads`` (HV), ``head_k_dim`` (K), ``head_v_dim`` (V), ``conv_size`` (W), ``rms_norm_eps`` and
    ``linear_layers`` (the delta-rule layers, 0-based). A ValueError names a missing config.json, an
    unsupported model_type or a bad field."""
    return _core.model_config(os.fspath(path))


class DeltaRuleLayer:
    """One delta-rule layer of a checkpoint (projections, short conv, gates, the delta-rule core, gated
    RMSNorm, output projection), in the fp32 or the bf16 pipeline (design §2), of any supported model
    type: :meth:`from_pretrained` gives the subclass of the checkpoint's family (``LAYER_CLASSES``, one per
    family of kda's registry: :class:`KimiDeltaAttention`, :class:`Qwen3NextGatedDeltaNet`, ...).

    Shapes: H key heads of K dims (``num_k_heads``, ``head_k_dim``), HV value heads of V dims
    (``num_v_heads``, ``head_v_dim``; HV a multiple of H, KDA: HV = H, V = K), conv width W
    (``conv_size``). Per sequence the layer keeps a recurrent state [HV, K, V] (float32) and a conv
    state [W-1, C] (the layer's dtype): C = 2*H*K + HV*V channels q|k|v, the raw projections before
    the conv and SiLU, oldest row first (transformers' [C, W] conv cache without its first column,
    transposed)."""

    #: The layer families (their first config.json model_type) the class serves; None: any.
    model_types: tuple[str, ...] | None = None

    def __init__(self, core: "_core.Layer"):
        self._core = core

    @classmethod
    def from_pretrained(cls, path, layer=None, dtype="bfloat16", kernel="auto", weights="bf16") -> "DeltaRuleLayer":
        """Layer ``layer`` (0-based model layer index; None: the first delta-rule layer) of the checkpoint
        in directory ``path`` (config.json + safetensors; the family from config.json's model_type).
        ``dtype``: "float32" or "bfloat16". ``kernel``: "auto", "optimized" or "reference".
        ``weights``: "bf16" (the projections as the pipeline casts the checkpoint's weights) or "int8"
        (Q8_0 projection weights, quantized at load or read from a ``kda quantize`` checkpoint).

        A subclass refuses a checkpoint of another family (ValueError naming its model_type and the
        class to use) before reading weights; ``DeltaRuleLayer.from_pretrained`` returns the
        subclass of the checkpoint's family."""
        path = os.fspath(path)
        cfg = model_config(path)
        target = _layer_class_for(cfg["family"])
        if cls.model_types is not None and cfg["family"] not in cls.model_types:
            raise ValueError(f"{path}: model_type {cfg['model_type']!r} has {cfg['layer_class']} layers, not "
                             f"{cls.__name__}: use kda.{target.__name__}.from_pretrained")
        if layer is None:
            layer = cfg["linear_layers"][0]
        core = _core.Layer(path, int(layer), str(dtype), str(kernel), str(weights))
        return (target if issubclass(target, cls) else cls)(core)

    model_type = property(lambda self: self._core.model_type)  # the family: "kimi_linear", "qwen3_next", ...
    layer_class = property(lambda self: self._core.layer_class)  # e.g. "Qwen3NextGatedDeltaNet"
    hidden_size = property(lambda self: self._core.hidden_size)
    num_k_heads = property(lambda self: self._core.num_k_heads)  # H
    num_v_heads = property(lambda self: self._core.num_v_heads)  # HV
    head_k_dim = property(lambda self: self._core.head_k_dim)  # K
    head_v_dim = property(lambda self: self._core.head_v_dim)  # V
    num_heads = property(lambda self: self._core.num_heads)  # H (KDA's heads)
    head_dim = property(lambda self: self._core.head_dim)  # K (KDA's head dim)
    conv_size = property(lambda self: self._core.conv_size)  # W
    dtype = property(lambda self: self._core.dtype)
    weights = property(lambda self: self._core.weights)

    def forward(self, hidden_states, cu_seqlens=None, initial_recurrent_state=None, initial_conv_state=None):
        """The layer over a packed batch: hidden_states ``[T, hidden]`` in the layer's dtype, cu_seqlens
        ``[N + 1]`` (None: one sequence), optional initial states float32 ``[N, HV, K, V]`` and
        ``[N, W-1, C]`` in the layer's dtype (C = 2*H*K + HV*V channels q|k|v, the raw projections
        before the conv and SiLU).

        Returns ``(out [T, hidden], final_recurrent_state [N, HV, K, V] float32, final_conv_state
        [N, W-1, C])``: torch tensors if hidden_states is one, else numpy arrays."""
        shape = shape_of(hidden_states, "hidden_states")
        if cu_seqlens is None:
            cu = np.array([0, shape[0] if shape else 0], dtype=np.int64)
        else:
            cu = int_array(cu_seqlens, "cu_seqlens", np.int64)
        rec = None if initial_recurrent_state is None else for_core(initial_recurrent_state, "initial_recurrent_state")
        conv = None if initial_conv_state is None else for_core(initial_conv_state, "initial_conv_state")
        out, frec, fconv = self._core.forward(for_core(hidden_states, "hidden_states"), cu, rec, conv)
        bf16 = self.dtype == "bfloat16"
        like = hidden_states
        return from_core(out, bf16, like), from_core(frec, False, like), from_core(fconv, bf16, like)

    __call__ = forward

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(model_type={self.model_type!r}, hidden_size={self.hidden_size}, "
                f"num_k_heads={self.num_k_heads}, num_v_heads={self.num_v_heads}, head_k_dim={self.head_k_dim}, "
                f"head_v_dim={self.head_v_dim}, conv_size={self.conv_size}, dtype={self.dtype!r}, "
                f"weights={self.weights!r})")


def _make_layer_classes() -> dict[str, type[DeltaRuleLayer]]:
    """One :class:`DeltaRuleLayer` subclass per layer family of kda's registry (its transformers class name,
    the family's model types and its layout in the docstring): the registry is the one list of families."""
    classes = {}
    for family in _core.layer_families():
        doc = f"{family['description']}\n\n    model_type: {', '.join(family['model_types'])}."
        classes[family["layer_class"]] = type(family["layer_class"], (DeltaRuleLayer,),
                                              {"__doc__": doc, "__module__": "kda",
                                               "model_types": (family["name"],)})
    return classes


#: The layer classes by name, one per family (kda.KimiDeltaAttention, kda.Qwen3NextGatedDeltaNet, ...).
LAYER_CLASSES = _make_layer_classes()


def _layer_class_for(family: str) -> type[DeltaRuleLayer]:
    """The layer class of a family (DeltaRuleLayer for one without a class of its own)."""
    return next((c for c in LAYER_CLASSES.values() if family in c.model_types), DeltaRuleLayer)


class RequestResult(NamedTuple):
    """A finished request: the last layer's output ``[T, hidden]`` and every layer's final states
    ``[L, HV, K, V]`` (float32) and ``[L, W-1, C]`` (the engine's dtype; C = 2*H*K + HV*V), L the
    engine's delta-rule layers in model order. ``cached_tokens``: rows reused from the prefix cache
    (their ``out`` rows were not computed: zeros)."""

    out: np.ndarray
    final_recurrent_state: np.ndarray
    final_conv_state: np.ndarray
    cached_tokens: int = 0


class Engine:
    """Serves requests through every delta-rule layer of a checkpoint (any supported model type:
    ``model_type``, ``layer_class`` and the shape properties as :class:`DeltaRuleLayer`'s) the way an
    engine does: a state pool of ``max_running`` slots, chunked prefill (``prefill_chunk`` tokens of a
    request per step, 0: no limit, at most ``step_token_budget`` per step), batched decode, slot reuse.
    Layer l reads the residual stream h_l (h_0 = the request's rows, h_{l+1} = h_l + layer_l(h_l)); a
    result's ``out`` is the last layer's output (the model's other layers are outside kda).
    ``weights``: "bf16" or "int8", as for :meth:`DeltaRuleLayer.from_pretrained`.

    Speculative decoding (docs/speculative.md): with ``max_draft_tokens`` k > 0 each slot can verify
    up to k draft rows per step (TARGET_VERIFY) and keep the accepted ones; requests pass a draft
    source to :meth:`submit`. ``verify_method``: "recompute" (the default: the commit reruns the kept
    positions from their saved projections) or "token_states" (keeps the state after every position,
    2 MiB per position and layer at Kimi-Linear's shapes).

    ``state_budget_bytes`` (0: no limit) bounds the state pool's bytes, every slot's recurrent and
    conv states and its verify area included: the pool holds as many requests as fit, at most
    ``max_running`` (a ValueError if not even one fits). ``pool_capacity`` and ``pool_bytes`` tell
    what was allocated. ``max_running`` 0: as many requests as the state budget holds.

    ``prefix_cache_bytes`` (0: off) turns on recurrent prefix caching (docs/prefix-cache.md):
    requests submitted with ``token_ids`` start from the deepest cached snapshot of their prefix;
    snapshots are taken every ``snapshot_interval`` tokens (a multiple of 64) inside prefills and at
    the end of each prompt and request. The options follow the same rules as ``kda run`` and
    ``kda bench`` (kda::ServingOptions)."""

    def __init__(self, path, max_running=16, prefill_chunk=0, dtype="bfloat16", step_token_budget=4096,
                 kernel="auto", weights="bf16", max_draft_tokens=0, verify_method="recompute", state_budget_bytes=0,
                 prefix_cache_bytes=0, snapshot_interval=256):
        self._core = _core.Engine(os.fspath(path), str(dtype), int(max_running), int(prefill_chunk),
                                  int(step_token_budget), str(kernel), str(weights), int(max_draft_tokens),
                                  str(verify_method), int(state_budget_bytes), int(prefix_cache_bytes),
                                  int(snapshot_interval))
        self._ids = itertools.count()
        self._like = {}
        #: Requests that ended without a result in the last run(): id -> error message.
        self.failed: dict[int, str] = {}

    num_layers = property(lambda self: self._core.num_layers)
    layer_ids = property(lambda self: list(self._core.layer_ids))  # 0-based model layer index of each layer
    model_type = property(lambda self: self._core.model_type)
    layer_class = property(lambda self: self._core.layer_class)
    hidden_size = property(lambda self: self._core.hidden_size)
    num_k_heads = property(lambda self: self._core.num_k_heads)
    num_v_heads = property(lambda self: self._core.num_v_heads)
    head_k_dim = property(lambda self: self._core.head_k_dim)
    head_v_dim = property(lambda self: self._core.head_v_dim)
    conv_size = property(lambda self: self._core.conv_size)
    dtype = property(lambda self: self._core.dtype)
    weights = property(lambda self: self._core.weights)
    pool_capacity = property(lambda self: self._core.pool_capacity)  # requests the state pool holds
    pool_bytes = property(lambda self: self._core.pool_bytes)  # its bytes, the dummy slot included

    def submit(self, hidden_states, decode_tokens=0, initial_recurrent_state=None, initial_conv_state=None,
               request_id=None, draft=None, accept=None, seeded_drafts=None, token_ids=None) -> int:
        """Queues a request: its input rows ``[T, hidden]`` (the engine's dtype), of which the last
        ``decode_tokens`` are fed one at a time as decode steps after the prefill; optional initial
        states ``[L, HV, K, V]`` float32 and ``[L, W-1, C]`` (the engine's dtype). The arrays are read
        in place during run() (keep them unchanged until then). Returns the request id.

        Drafts (an engine with ``max_draft_tokens`` > 0): ``draft(committed, max_k)`` returns up to
        ``max_k`` draft rows ``[k, hidden]`` (or None) proposed after the request's first
        ``committed`` rows; the engine verifies its next row and the drafts in one step and keeps the
        next row plus ``accept(committed, k, out)`` of the drafts (``out``: the step's outputs
        ``[1 + k, hidden]`` of its positions; no ``accept``: all of them). Accepted drafts stand for
        the request's next rows. Or ``seeded_drafts=(k, alpha, seed)``: k of the request's own next
        rows per step, each accepted with probability alpha until the first rejection (the others
        replaced by a different row), as ``kda bench --workload speculative`` does. A callback that
        raises fails its request (``self.failed``).

        ``token_ids`` (int32 ``[T]``, the ids the rows were made from): the prefix cache's key, for an
        engine with ``prefix_cache_bytes``; a request with an initial state is never cached."""
        rid = next(self._ids) if request_id is None else int(request_id)
        rec = None if initial_recurrent_state is None else for_core(initial_recurrent_state, "initial_recurrent_state")
        conv = None if initial_conv_state is None else for_core(initial_conv_state, "initial_conv_state")
        propose = accept_core = seeded = None
        if draft is not None:
            want = BF16 if self.dtype == "bfloat16" else np.dtype(np.float32)
            hidden = self.hidden_size

            def propose(committed, max_k, out):  # out: [max_k, hidden], bf16 as uint16 bits
                rows = draft(committed, max_k)
                if rows is None:
                    return 0
                if np_dtype(rows) != want:
                    raise TypeError(f"draft rows: dtype must be {want}, got {np_dtype(rows) or type(rows).__name__}")
                shape = shape_of(rows, "draft rows")
                if len(shape) != 2 or shape[1] != hidden or shape[0] > max_k:
                    raise ValueError(f"draft rows: expected shape [k, {hidden}] with k <= {max_k}, got {list(shape)}")
                out[:shape[0]] = np.asarray(for_core(rows, "draft rows"))
                return shape[0]
        if accept is not None:
            bf16 = self.dtype == "bfloat16"

            def accept_core(committed, k, out):
                return int(accept(committed, k, from_core(out, bf16, None)))
        if seeded_drafts is not None:
            k, alpha, seed = seeded_drafts
            seeded = (int(k), float(alpha), int(seed))
        ids = None if token_ids is None else np.ascontiguousarray(token_ids, dtype=np.int32)
        self._core.submit(rid, for_core(hidden_states, "hidden_states"), int(decode_tokens), rec, conv, propose,
                          accept_core, seeded, ids)
        self._like[rid] = hidden_states
        return rid

    def run(self) -> dict[int, RequestResult]:
        """Runs every submitted request to its end; returns the results by request id (requests that
        failed are in ``self.failed`` instead)."""
        done, failed = self._core.run()
        bf16 = self.dtype == "bfloat16"
        results = {}
        for rid, out, rec, conv, cached in done:
            like = self._like.pop(rid, None)
            results[rid] = RequestResult(from_core(out, bf16, like), from_core(rec, False, like),
                                         from_core(conv, bf16, like), int(cached))
        self.failed = dict(failed)
        for rid in self.failed:
            self._like.pop(rid, None)
        return results
