"""The KDA layer of a checkpoint and the serving engine over all its KDA layers."""

from __future__ import annotations

import itertools
import json
import os
from typing import NamedTuple

import numpy as np

from . import _core
from ._arrays import for_core, from_core, int_array, shape_of


def _first_kda_layer(path) -> int:
    try:
        with open(os.path.join(os.fspath(path), "config.json")) as f:
            cfg = json.load(f)
        layers = cfg["linear_attn_config"]["kda_layers"]  # 1-based, as Hugging Face writes them
        return int(min(layers)) - 1
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: cannot find the KDA layers in config.json ({e}); pass layer=") from None


class KimiDeltaAttention:
    """One KDA layer of a Kimi-Linear checkpoint (projections, short convs, gates, the KDA core,
    gated RMSNorm, o_proj), in the fp32 or the bf16 pipeline (design §2)."""

    def __init__(self, core: "_core.KdaLayer"):
        self._core = core

    @classmethod
    def from_pretrained(cls, path, layer=None, dtype="bfloat16", kernel="auto", weights="bf16") -> "KimiDeltaAttention":
        """Layer ``layer`` (0-based model layer index; None: the first KDA layer) of the checkpoint in
        directory ``path`` (config.json + safetensors). ``dtype``: "float32" or "bfloat16".
        ``weights``: "bf16" (the projections as the pipeline casts the checkpoint's weights) or
        "int8" (Q8_0 projection weights, quantized at load or read from a ``kda quantize`` checkpoint)."""
        if layer is None:
            layer = _first_kda_layer(path)
        return cls(_core.KdaLayer(os.fspath(path), int(layer), str(dtype), str(kernel), str(weights)))

    hidden_size = property(lambda self: self._core.hidden_size)
    num_heads = property(lambda self: self._core.num_heads)
    head_dim = property(lambda self: self._core.head_dim)
    conv_size = property(lambda self: self._core.conv_size)
    dtype = property(lambda self: self._core.dtype)
    weights = property(lambda self: self._core.weights)

    def forward(self, hidden_states, cu_seqlens=None, initial_recurrent_state=None, initial_conv_state=None):
        """The layer over a packed batch: hidden_states ``[T, hidden]`` in the layer's dtype, cu_seqlens
        ``[N + 1]`` (None: one sequence), optional initial states float32 ``[N, H, K, V]`` and
        ``[N, W-1, 3P]`` in the layer's dtype (channels q|k|v, the raw projections before SiLU).

        Returns ``(out [T, hidden], final_recurrent_state [N, H, K, V] float32, final_conv_state
        [N, W-1, 3P])``: torch tensors if hidden_states is one, else numpy arrays."""
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


class RequestResult(NamedTuple):
    """A finished request: the last layer's output ``[T, hidden]`` and every layer's final states
    ``[L, H, K, V]`` (float32) and ``[L, W-1, 3P]`` (the engine's dtype)."""

    out: np.ndarray
    final_recurrent_state: np.ndarray
    final_conv_state: np.ndarray


class Engine:
    """Serves requests through every KDA layer of a checkpoint the way an engine does: a state pool
    of ``max_running`` slots, chunked prefill (``prefill_chunk`` tokens of a request per step, 0: no
    limit, at most ``step_token_budget`` per step), batched decode, slot reuse. ``weights``: "bf16" or
    "int8", as for :meth:`KimiDeltaAttention.from_pretrained`."""

    def __init__(self, path, max_running=16, prefill_chunk=0, dtype="bfloat16", step_token_budget=4096,
                 kernel="auto", weights="bf16"):
        self._core = _core.Engine(os.fspath(path), str(dtype), int(max_running), int(prefill_chunk),
                                  int(step_token_budget), str(kernel), str(weights))
        self._ids = itertools.count()
        self._like = {}
        #: Requests that ended without a result in the last run(): id -> error message.
        self.failed: dict[int, str] = {}

    num_layers = property(lambda self: self._core.num_layers)
    layer_ids = property(lambda self: list(self._core.layer_ids))
    hidden_size = property(lambda self: self._core.hidden_size)
    dtype = property(lambda self: self._core.dtype)
    weights = property(lambda self: self._core.weights)

    def submit(self, hidden_states, decode_tokens=0, initial_recurrent_state=None, initial_conv_state=None,
               request_id=None) -> int:
        """Queues a request: its input rows ``[T, hidden]`` (the engine's dtype), of which the last
        ``decode_tokens`` are fed one at a time as decode steps after the prefill; optional initial
        states ``[L, H, K, V]`` float32 and ``[L, W-1, 3P]``. The arrays are read in place during
        run() (keep them unchanged until then). Returns the request id."""
        rid = next(self._ids) if request_id is None else int(request_id)
        rec = None if initial_recurrent_state is None else for_core(initial_recurrent_state, "initial_recurrent_state")
        conv = None if initial_conv_state is None else for_core(initial_conv_state, "initial_conv_state")
        self._core.submit(rid, for_core(hidden_states, "hidden_states"), int(decode_tokens), rec, conv)
        self._like[rid] = hidden_states
        return rid

    def run(self) -> dict[int, RequestResult]:
        """Runs every submitted request to its end; returns the results by request id (requests that
        failed are in ``self.failed`` instead)."""
        done, failed = self._core.run()
        bf16 = self.dtype == "bfloat16"
        results = {}
        for rid, out, rec, conv in done:
            like = self._like.pop(rid, None)
            results[rid] = RequestResult(from_core(out, bf16, like), from_core(rec, False, like),
                                         from_core(conv, bf16, like))
        self.failed = dict(failed)
        for rid in self.failed:
            self._like.pop(rid, None)
        return results
