#!/usr/bin/python3
"""Float64 reference for one delta-rule layer of five model families, and the writer of their golden sets.

The families (transformers 5.25 layer classes; checkpoint tensor names as the original checkpoints hold them):

  set           model_type      kind  layer under                             projections
  glm5-mini     glm5_next       KDA   model.language_model.layers.{i}.        Kimi's: q/k/v_proj, low-rank
                (text_config:         self_attn.                              f_a/f_b (gate) and g_a/g_b (output
                glm5_next_text)                                               gate), b_proj, o_proj; q/k/v_conv1d F32
  bailing-mini  bailing_hybrid  KDA   model.layers.{i}.attention.             q/k/v_proj, full-rank f_proj and g_proj,
                                                                              b_proj, dense; q/k/v_conv1d F32
  olmo-mini     olmo_hybrid     GDN   model.layers.{i}.linear_attn.           q/k/v/a/b/g_proj, o_proj; q/k/v_conv1d
  lara-mini     lara_mini       GDN   model.layers.{i}.linear_attn.           one in_proj, rows q|k|v|z|b|a; conv1d;
                                                                              out_norm, out_proj
  qwen4-mini    qwen4_exp       GDN   model.language_model.layers.{i}.        Qwen3.5's: in_proj_qkv, in_proj_z,
                (text_config:         linear_attn.                            in_proj_b, in_proj_a; conv1d; norm,
                qwen4_exp_text)                                               out_proj

Shapes: H key heads of K dims, HV value heads of V dims (KDA: HV = H, V = K), r = HV / H (value head h reads key
head h // r), p = H*K, C = 2*H*K + HV*V conv channels (q|k|v, head-major), W the conv width, T tokens, N sequences.

The layer, per sequence (a batch packs sequences along T; cu_seqlens [N+1] gives the boundaries):

  q|k|v  = silu(causal depthwise conv_W(x W_{q|k|v}^T))   [T, C]; tap W-1 multiplies the current token; rows
           before the sequence start come from its conv tail [W-1, C] (raw projection outputs, oldest first;
           zeros for a fresh sequence), never from a neighbouring sequence
  q, k   = x / sqrt(sum_K x^2 + 1e-6) per key head;  q *= K^-0.5
  gate   KDA, per key dim: u = f + dt_bias[h*K + d],  f = the gate projection [T, H, K]
             softplus gate:     g = -exp(A_log[h]) * softplus(u)
             lower-bound gate:  g = L * sigmoid(exp(A_log[h]) * u)     (L = -5: glm5_next, bailing_hybrid)
         GDN, per value head: g = -exp(A_log[h]) * softplus(a + dt_bias[h])    [T, HV]
  beta   = beta_scale * sigmoid(b)    beta_scale 2 for olmo_hybrid (negative eigenvalues), else 1   [T, HV]
  S_t    = D(g_t) S_{t-1};  S_t += beta_t k_t (v_t - S_t^T k_t)^T;  o_t = S_t^T q_t
           S per value head [K, V] (K-major); D = diag(exp(g)) (KDA) or exp(g) I (GDN)
  y      = o * rsqrt(mean_V(o^2) + eps) * norm.weight * act(z)    per value head;  z the output-gate projection,
           act sigmoid (KDA; qwen4_exp with output_gate_type sigmoid) or silu; eps = rms_norm_eps (olmo_hybrid: 1e-5)
  out    = flatten(y) W_out^T

softplus(x) = x for x > 20 (torch's threshold).

fp32 pipeline: the maths above in float64 (the exact answer; no casts).
bf16 pipeline (`bf16=True`), the cast points of the project's bf16 layer (design §2, carried over):
  bf16: weights (conv weights of glm5_next and bailing_hybrid stay fp32), x, every projection output (fp32
        accumulation, rounded once; a low-rank projection rounds its bottleneck and its output), the conv output
        after SiLU (fp32 arithmetic on the bf16 projections, rounded once), the kernel output o, the gated-norm
        output, the output projection's output, the conv tail (an initial conv state is rounded too);
        bailing_hybrid's activated gate g (transformers casts it to the activation dtype).
  fp32: g (from the bf16 projection + fp32 dt_bias; the lower-bound gate included) and beta (beta_scale applied
        in fp32), the L2 norm, all kernel internals, the recurrent state, the gated-norm arithmetic (rsqrt,
        weight and act(z) in one expression).
  The "fp32" quantities are computed in float64: the bf16 answer is the exact result of a pipeline whose only
  errors are those roundings.

A golden set (`python3 tools/delta_rule_ref.py OUTDIR --set glm5-mini`): config.json in Hugging Face form (the
family's own field names), model.safetensors with every linear layer's weights (BF16; glm5_next's and
bailing_hybrid's conv weights F32) and one safetensors file per case, computed for layer 0 (see CASES and
case_tensors()). Debian's python3 with numpy; no torch.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

L2_EPS = 1e-6  # the q/k L2 norm's eps (fla, transformers)

# ----------------------------------------------------------------------------------------------- bf16


def bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), as float64; rounds float64 directly (no double
    rounding through float32). Normal range only, which is all the layer meets."""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))  # x = m 2^e, 0.5 <= |m| < 1
    return np.ldexp(np.rint(np.ldexp(m, 8)), e - 8)  # 8 significant bits


def bf16_bits(x) -> np.ndarray:
    """The BF16 encoding of bf16-exact values."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32))
    u = f.view(np.uint32)
    assert not (u & 0xFFFF).any(), "a BF16 tensor holds a value that is not bf16-exact"
    return (u >> 16).astype(np.uint16)


# ---------------------------------------------------------------------------------------- safetensors

_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def write_safetensors(path: str, tensors: dict, bf16_names=(), meta: dict | None = None) -> None:
    """tensors: name -> array; names in bf16_names are stored as BF16 (their values must be bf16-exact),
    float arrays otherwise as F32, int32 as I32."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        if name in bf16_names:
            raw, dt = bf16_bits(a), "BF16"
        elif a.dtype.kind == "f":
            raw, dt = np.ascontiguousarray(a.astype(np.float32)), "F32"
        else:
            raw, dt = np.ascontiguousarray(a.astype(np.int32)), "I32"
        b = raw.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path: str) -> dict:
    """Every tensor of a safetensors file as float64 (integers as int64)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        a, b = (8 + n + o for o in d["data_offsets"])
        if d["dtype"] == "BF16":
            arr = (np.frombuffer(data[a:b], np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(data[a:b], _DTYPES[d["dtype"]])
        arr = arr.astype(np.int64 if arr.dtype.kind == "i" else np.float64)
        out[name] = arr.reshape(d["shape"])
    return out


# ----------------------------------------------------------------------------------------- families


class Family:
    """One family's layer: geometry, variant switches, config.json, checkpoint names.

    Canonical weights (float64, head-major rows) that forward() reads:
      q [H*K, hid], k [H*K, hid], v [HV*V, hid]   projections
      conv [C, W]                                 depthwise conv, channels q|k|v
      gate [mats]   f (KDA, [p] out) or a (GDN, [HV] out): a chain of matrices, applied in order
      b [HV, hid]                                 beta logits
      z [mats]      the output gate's input projection, a chain like gate
      A_log [HV], dt_bias [p] (KDA) or [HV] (GDN), norm [V], out [hid, HV*V]
    """

    set_name = ""
    model_type = ""
    kda = False  # per-key-dim decay (KDA) or per-value-head (GDN)
    root = "model.layers."  # layer i's tensors: root + f"{i}." + prefix + name
    prefix = ""
    lower_bound = None  # KDA lower-bound gate L (None: softplus gate)
    round_gate = False  # bailing_hybrid: the activated gate g is rounded to bf16 in the bf16 pipeline
    beta_scale = 1.0
    out_act = "silu"  # the gated norm's gate activation
    conv_f32 = False  # conv weights kept fp32 in the checkpoint and in the bf16 pipeline

    def __init__(self, hidden, H, HV, K, V, W=4, eps=1e-6, norm_eps=None, n_layers=4):
        assert HV % H == 0 and (not self.kda or (HV == H and V == K))
        self.hidden, self.H, self.HV, self.K, self.V, self.W = hidden, H, HV, K, V, W
        self.eps = eps  # config rms_norm_eps
        self.norm_eps = eps if norm_eps is None else norm_eps  # the gated norm's eps
        self.n_layers = n_layers

    @property
    def key_dim(self):
        return self.H * self.K

    @property
    def value_dim(self):
        return self.HV * self.V

    @property
    def conv_dim(self):
        return 2 * self.key_dim + self.value_dim

    @property
    def gate_width(self):  # per token: p (KDA) or HV (GDN)
        return self.key_dim if self.kda else self.HV

    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types()) if t == "linear_attention"]

    def layer_types(self) -> list[str]:
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError

    def to_checkpoint(self, c: dict) -> dict:
        """Canonical weights -> the layer's checkpoint tensors (names relative to the layer prefix)."""
        raise NotImplementedError

    def from_checkpoint(self, w: dict) -> dict:
        """The layer's checkpoint tensors -> canonical weights."""
        raise NotImplementedError

    def f32_names(self) -> set:
        """Checkpoint tensors stored F32 (the rest: BF16)."""
        return {f"{g}_conv1d.weight" for g in "qkv"} if self.conv_f32 else set()

    # Shared by the configs: the text model's sizes, the Gated DeltaNet head fields, and the file around them
    # (flat, or the text model under text_config of type `text_type`).
    def text_fields(self, **fields) -> dict:
        return {"hidden_size": self.hidden, "num_hidden_layers": self.n_layers, "hidden_act": "silu",
                "rms_norm_eps": self.eps, **fields}

    def gdn_fields(self) -> dict:
        return {"linear_num_key_heads": self.H, "linear_num_value_heads": self.HV, "linear_key_head_dim": self.K,
                "linear_value_head_dim": self.V, "linear_conv_kernel_dim": self.W}

    def hf_config(self, architecture: str, text: dict, text_type: str | None = None) -> dict:
        body = {"text_config": {"model_type": text_type, **text}} if text_type else text
        return {"architectures": [architecture], "model_type": self.model_type, **body, "torch_dtype": "bfloat16"}

    # Shared by the layouts: separate q/k/v convs [rows, 1, W] <-> one [C, W].
    def split_conv(self, conv):
        kd = self.key_dim
        return {"q_conv1d.weight": conv[:kd, None, :], "k_conv1d.weight": conv[kd:2 * kd, None, :],
                "v_conv1d.weight": conv[2 * kd:, None, :]}

    def join_conv(self, w):
        return np.concatenate([w[f"{g}_conv1d.weight"].reshape(-1, self.W) for g in "qkv"], axis=0)


class Glm5Next(Family):
    set_name, model_type, kda = "glm5-mini", "glm5_next", True
    root, prefix = "model.language_model.layers.", "self_attn."
    lower_bound, out_act, conv_f32 = -5.0, "sigmoid", True

    def layer_types(self):
        return ["linear_attention"] * 3 + ["indexed_attention"]

    def config(self):
        return self.hf_config("Glm5NextForConditionalGeneration", self.text_fields(
            layer_types=self.layer_types(), linear_num_heads=self.H, linear_head_dim=self.K,
            linear_conv_kernel_dim=self.W, linear_lower_bound=self.lower_bound), "glm5_next_text")

    def to_checkpoint(self, c):
        fa, fb = c["gate"]
        ga, gb = c["z"]
        return {"q_proj.weight": c["q"], "k_proj.weight": c["k"], "v_proj.weight": c["v"], **self.split_conv(c["conv"]),
                "f_a_proj.weight": fa, "f_b_proj.weight": fb, "b_proj.weight": c["b"], "g_a_proj.weight": ga,
                "g_b_proj.weight": gb, "o_norm.weight": c["norm"], "o_proj.weight": c["out"], "A_log": c["A_log"],
                "dt_bias": c["dt_bias"]}

    def from_checkpoint(self, w):
        return {"q": w["q_proj.weight"], "k": w["k_proj.weight"], "v": w["v_proj.weight"], "conv": self.join_conv(w),
                "gate": [w["f_a_proj.weight"], w["f_b_proj.weight"]], "b": w["b_proj.weight"],
                "z": [w["g_a_proj.weight"], w["g_b_proj.weight"]], "norm": w["o_norm.weight"],
                "out": w["o_proj.weight"], "A_log": w["A_log"].reshape(-1), "dt_bias": w["dt_bias"]}


class BailingHybrid(Family):
    set_name, model_type, kda = "bailing-mini", "bailing_hybrid", True
    prefix = "attention."
    lower_bound, round_gate, out_act, conv_f32 = -5.0, True, "sigmoid", True

    def layer_types(self):  # no layer_types in config.json: layer i is full iff (i + 1) % layer_group_size == 0
        return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(self.n_layers)]

    def config(self):
        return self.hf_config("BailingHybridForCausalLM", self.text_fields(
            num_attention_heads=self.H, num_key_value_heads=self.H, head_dim=self.K, short_conv_kernel_size=self.W,
            layer_group_size=4, kda_safe_gate=True, kda_lower_bound=self.lower_bound))

    def to_checkpoint(self, c):
        (f,), (g,) = c["gate"], c["z"]
        return {"q_proj.weight": c["q"], "k_proj.weight": c["k"], "v_proj.weight": c["v"], **self.split_conv(c["conv"]),
                "f_proj.weight": f, "b_proj.weight": c["b"], "g_proj.weight": g, "o_norm.weight": c["norm"],
                "dense.weight": c["out"], "A_log": c["A_log"], "dt_bias": c["dt_bias"]}

    def from_checkpoint(self, w):
        return {"q": w["q_proj.weight"], "k": w["k_proj.weight"], "v": w["v_proj.weight"], "conv": self.join_conv(w),
                "gate": [w["f_proj.weight"]], "b": w["b_proj.weight"], "z": [w["g_proj.weight"]],
                "norm": w["o_norm.weight"], "out": w["dense.weight"], "A_log": w["A_log"].reshape(-1),
                "dt_bias": w["dt_bias"]}


class OlmoHybrid(Family):
    set_name, model_type = "olmo-mini", "olmo_hybrid"
    prefix = "linear_attn."
    beta_scale = 2.0  # linear_allow_neg_eigval

    def layer_types(self):  # no layer_types in config.json: layer i is full iff i % 4 == 3
        return ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(self.n_layers)]

    def config(self):
        return self.hf_config("OlmoHybridForCausalLM", self.text_fields(
            num_attention_heads=self.H, **self.gdn_fields(), linear_allow_neg_eigval=True))

    def to_checkpoint(self, c):
        (a,), (g,) = c["gate"], c["z"]
        return {"q_proj.weight": c["q"], "k_proj.weight": c["k"], "v_proj.weight": c["v"], "a_proj.weight": a,
                "b_proj.weight": c["b"], "g_proj.weight": g, "o_proj.weight": c["out"], **self.split_conv(c["conv"]),
                "A_log": c["A_log"], "dt_bias": c["dt_bias"], "o_norm.weight": c["norm"]}

    def from_checkpoint(self, w):
        return {"q": w["q_proj.weight"], "k": w["k_proj.weight"], "v": w["v_proj.weight"], "conv": self.join_conv(w),
                "gate": [w["a_proj.weight"]], "b": w["b_proj.weight"], "z": [w["g_proj.weight"]],
                "norm": w["o_norm.weight"], "out": w["o_proj.weight"], "A_log": w["A_log"], "dt_bias": w["dt_bias"]}


class LaraMini(Family):
    set_name, model_type = "lara-mini", "lara_mini"
    prefix = "linear_attn."

    def layer_types(self):  # no layer_types in config.json: the period-5 pattern
        pattern = ["linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention"]
        return [pattern[i % 5] for i in range(self.n_layers)]

    def config(self):
        return self.hf_config("LaraMiniForCausalLM", self.text_fields(
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, **self.gdn_fields()))

    def to_checkpoint(self, c):
        (a,), (z,) = c["gate"], c["z"]
        return {"in_proj.weight": np.concatenate([c["q"], c["k"], c["v"], z, c["b"], a], axis=0),
                "conv1d.weight": c["conv"][:, None, :], "A_log": c["A_log"], "dt_bias": c["dt_bias"],
                "out_norm.weight": c["norm"], "out_proj.weight": c["out"]}

    def from_checkpoint(self, w):
        m = w["in_proj.weight"]
        ends = np.cumsum([self.key_dim, self.key_dim, self.value_dim, self.value_dim, self.HV, self.HV])
        q, k, v, z, b, a = np.split(m, ends[:-1], axis=0)
        assert m.shape[0] == ends[-1]
        return {"q": q, "k": k, "v": v, "conv": w["conv1d.weight"].reshape(-1, self.W), "gate": [a], "b": b, "z": [z],
                "norm": w["out_norm.weight"], "out": w["out_proj.weight"], "A_log": w["A_log"], "dt_bias": w["dt_bias"]}


class Qwen4Exp(Family):
    set_name, model_type = "qwen4-mini", "qwen4_exp"
    root, prefix = "model.language_model.layers.", "linear_attn."
    out_act = "sigmoid"  # output_gate_type

    def layer_types(self):
        return ["linear_attention"] * 3 + ["full_attention"]

    def config(self):
        return self.hf_config("Qwen4ExpForConditionalGeneration", self.text_fields(
            layer_types=self.layer_types(), full_attention_interval=4, **self.gdn_fields(),
            output_gate_type=self.out_act), "qwen4_exp_text")

    def to_checkpoint(self, c):
        (a,), (z,) = c["gate"], c["z"]
        return {"in_proj_qkv.weight": np.concatenate([c["q"], c["k"], c["v"]], axis=0), "in_proj_z.weight": z,
                "in_proj_b.weight": c["b"], "in_proj_a.weight": a, "conv1d.weight": c["conv"][:, None, :],
                "A_log": c["A_log"], "dt_bias": c["dt_bias"], "norm.weight": c["norm"], "out_proj.weight": c["out"]}

    def from_checkpoint(self, w):
        qkv, kd = w["in_proj_qkv.weight"], self.key_dim
        return {"q": qkv[:kd], "k": qkv[kd:2 * kd], "v": qkv[2 * kd:], "conv": w["conv1d.weight"].reshape(-1, self.W),
                "gate": [w["in_proj_a.weight"]], "b": w["in_proj_b.weight"], "z": [w["in_proj_z.weight"]],
                "norm": w["norm.weight"], "out": w["out_proj.weight"], "A_log": w["A_log"], "dt_bias": w["dt_bias"]}


class KimiLinear(Glm5Next):
    """Kimi-Linear's KDA layer: Glm5Next's tensors under model.layers.{i}.self_attn., the softplus gate, bf16 conv
    weights, A_log stored [1, 1, H, 1]."""
    set_name, model_type = "kda-mini", "kimi_linear"
    root, prefix = "model.layers.", "self_attn."
    lower_bound, conv_f32 = None, False

    def layer_types(self):
        return ["linear_attention"] * 3 + ["full_attention"]

    def config(self):
        return self.hf_config("KimiLinearForCausalLM", self.text_fields(num_attention_heads=self.H, linear_attn_config={
            "kda_layers": [i + 1 for i in self.linear_layers()],  # 1-based
            "full_attn_layers": [i + 1 for i, t in enumerate(self.layer_types()) if t != "linear_attention"],
            "head_dim": self.K, "num_heads": self.H, "short_conv_kernel_size": self.W}))

    def to_checkpoint(self, c):
        return {**super().to_checkpoint(c), "A_log": c["A_log"].reshape(1, 1, self.H, 1)}


class Qwen35Text(Qwen4Exp):
    """Qwen3.5's Gated DeltaNet (qwen3_5_text): Qwen4Exp's tensors under model.layers.{i}.linear_attn., silu output
    gate, a flat config."""
    set_name, model_type = "gdn-gva3", "qwen3_5_text"
    root, out_act = "model.layers.", "silu"

    def config(self):
        return self.hf_config("Qwen3_5ForCausalLM", self.text_fields(
            layer_types=self.layer_types(), full_attention_interval=4, **self.gdn_fields()))


class Qwen3Next(Qwen35Text):
    """Qwen3-Next's Gated DeltaNet: in_proj_qkvz and in_proj_ba interleaved per key head (for key head h: q_h, k_h,
    then the r value heads' v rows, then their z rows; b rows then a rows), conv1d channels q|k|v."""
    set_name, model_type = "gdn-mini", "qwen3_next"

    def config(self):
        return {**super().config(), "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}

    def to_checkpoint(self, c):
        (a,), (z,) = c["gate"], c["z"]
        H, K, V, r = self.H, self.K, self.V, self.HV // self.H
        qkvz, ba = [], []
        for h in range(H):
            vs = slice(h * r * V, (h + 1) * r * V)
            qkvz += [c["q"][h * K:(h + 1) * K], c["k"][h * K:(h + 1) * K], c["v"][vs], z[vs]]
            ba += [c["b"][h * r:(h + 1) * r], a[h * r:(h + 1) * r]]
        return {"in_proj_qkvz.weight": np.concatenate(qkvz, axis=0), "in_proj_ba.weight": np.concatenate(ba, axis=0),
                "conv1d.weight": c["conv"][:, None, :], "A_log": c["A_log"], "dt_bias": c["dt_bias"],
                "norm.weight": c["norm"], "out_proj.weight": c["out"]}

    def from_checkpoint(self, w):
        H, K, V, r = self.H, self.K, self.V, self.HV // self.H
        qkvz = w["in_proj_qkvz.weight"].reshape(H, 2 * K + 2 * r * V, -1)
        ba = w["in_proj_ba.weight"].reshape(H, 2 * r, -1)
        cat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
        return {"q": cat(qkvz[:, :K]), "k": cat(qkvz[:, K:2 * K]), "v": cat(qkvz[:, 2 * K:2 * K + r * V]),
                "conv": w["conv1d.weight"].reshape(-1, self.W), "gate": [cat(ba[:, r:])], "b": cat(ba[:, :r]),
                "z": [cat(qkvz[:, 2 * K + r * V:])], "norm": w["norm.weight"], "out": w["out_proj.weight"],
                "A_log": w["A_log"], "dt_bias": w["dt_bias"]}


# ------------------------------------------------------------------------------------------ weights


def make_weights(fam: Family, rng: np.random.Generator, gates: str, v_scale: float = 1.0, std: float = 0.02,
                 gate_std: float = 0.5, b_std: float = 0.05) -> dict:
    """Canonical random weights, every checkpoint value bf16-exact except fp32 conv weights.

    gates (KDA softplus gate; u = f + dt_bias, g = -exp(A_log) softplus(u)):
      "mild":   A = U(1, 16), softplus(dt_bias) log-uniform in [1e-3, 1e-1], f of std about gate_std.
      "stress": A = U(1, 16), dt_bias ~ N(0, 1), f of std about 8: g down to about -250 per token.
    gates (KDA lower-bound gate; u = f + dt_bias, g = L sigmoid(exp(A_log) u)):
      "bound":  A = U(1, 16), dt_bias ~ N(0, 1), f of std about gate_std: many dims saturate at L, others
                decay slowly.
    gates (GDN softplus gate):
      "mild":   A = U(1, 16), dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1]: g in about [-1.6, -1e-3].
      "init":   transformers' init: dt_bias = 1, A = U(0.01, 16): g down to about -20 per token.
    v_scale enlarges the v rows (and so the kernel output o); b_std the beta logits (olmo: beta up to 2)."""
    h, H, HV, K, V, W = fam.hidden, fam.H, fam.HV, fam.K, fam.V, fam.W

    def lin(rows, cols, s=std):
        return bf16(rng.normal(0.0, s, (rows, cols)))

    c = {"q": lin(H * K, h), "k": lin(H * K, h), "v": lin(HV * V, h, std * v_scale)}
    conv = rng.normal(0.0, 0.5, (fam.conv_dim, W))
    c["conv"] = conv.astype(np.float32).astype(np.float64) if fam.conv_f32 else bf16(conv)
    c["b"] = lin(HV, h, b_std)
    if fam.kda:
        assert (gates == "bound") == (fam.lower_bound is not None)
        p = H * K
        if gates == "stress":  # the softplus gate's argument up to about 16: g down to about -250 per token
            gate_std = 8.0
        if isinstance(fam, Glm5Next):  # low-rank f_a [K, hid] -> f_b [p, K]; x f_a^T has std ~ 0.02 sqrt(hid)
            fa = lin(K, h)
            c["gate"] = [fa, lin(p, K, gate_std / (0.02 * math.sqrt(h) * math.sqrt(K)))]
            c["z"] = [lin(K, h), lin(p, K, 0.1)]
        else:
            c["gate"] = [lin(p, h, gate_std / math.sqrt(h))]
            c["z"] = [lin(p, h)]
        c["A_log"] = bf16(np.log(rng.uniform(1.0, 16.0, H)))
        if gates == "mild":  # the softplus gate near dt = softplus(dt_bias), log-uniform in [1e-3, 1e-1]
            dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), p))
            c["dt_bias"] = bf16(dt + np.log(-np.expm1(-dt)))
        else:
            c["dt_bias"] = bf16(rng.normal(0.0, 1.0, p))
    else:
        c["gate"] = [lin(HV, h, 0.05)]
        c["z"] = [lin(HV * V, h)]
        if gates == "init":
            c["A_log"] = bf16(np.log(rng.uniform(0.01, 16.0, HV)))
            c["dt_bias"] = bf16(np.ones(HV))
        else:
            c["A_log"] = bf16(np.log(rng.uniform(1.0, 16.0, HV)))
            dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), HV))
            c["dt_bias"] = bf16(dt + np.log(-np.expm1(-dt)))  # softplus^-1(dt)
    c["norm"] = bf16(rng.uniform(0.5, 1.5, V))
    c["out"] = lin(h, HV * V)
    return c


# ---------------------------------------------------------------------------------------- the layer


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2norm(x):  # over the last axis
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + L2_EPS)


def delta_rule(q, k, v, g, beta, S):
    """The gated delta rule token by token. q, k [T, H, K] (before the L2 norm); v [T, HV, V]; g [T, HV, K]
    (a GDN gate broadcast over K); beta [T, HV]; S [HV, K, V] (not modified). Returns o [T, HV, V], final S."""
    T, H, K = q.shape
    r = v.shape[1] // H
    q = np.repeat(l2norm(q) * K ** -0.5, r, axis=1)  # value head h reads key head h // r
    k = np.repeat(l2norm(k), r, axis=1)
    o = np.zeros(v.shape)
    for t in range(T):
        S = S * np.exp(g[t])[:, :, None]
        u = beta[t][:, None] * (v[t] - np.einsum("hk,hkv->hv", k[t], S))  # [HV, V]
        S = S + k[t][:, :, None] * u[:, None, :]
        o[t] = np.einsum("hk,hkv->hv", q[t], S)
    return o, S


def recurrent(q, k, v, g, beta, S):
    """delta_rule with either gate width: g [T, H, K] (KDA, HV = H) or [T, HV] (GDN, broadcast over K)."""
    g = np.asarray(g, dtype=np.float64)
    if g.ndim == 2:
        g = np.repeat(g[:, :, None], q.shape[-1], axis=2)
    return delta_rule(q, k, v, g, beta, S)


def forward(fam: Family, c: dict, x, cu, rec0=None, conv0=None, bf16_pipeline=False):
    """One layer over a packed batch. x [T, hidden]; cu [N+1]; rec0 [N, HV, K, V]; conv0 [N, W-1, C].
    Returns out [T, hidden], final recurrent state [N, HV, K, V], final conv tail [N, W-1, C] and the
    intermediates (a dict of the case tensors' names), all float64."""
    rnd = bf16 if bf16_pipeline else (lambda a: a)  # a cast point
    H, HV, K, V, W, kd = fam.H, fam.HV, fam.K, fam.V, fam.W, fam.key_dim
    x = rnd(np.asarray(x, dtype=np.float64))
    T, N = x.shape[0], len(cu) - 1

    def project(a, mats):  # a chain of projections, each output rounded once
        for m in mats:
            a = rnd(a @ m.T)
        return a

    conv_w = c["conv"] if fam.conv_f32 or not bf16_pipeline else bf16(c["conv"])  # [C, W]
    qkv = project(x, [np.concatenate([c["q"], c["k"], c["v"]], axis=0)])  # [T, C] raw conv inputs
    f = project(x, c["gate"])  # [T, p] (KDA) or [T, HV] (GDN)
    b = project(x, [c["b"]])  # [T, HV]
    z = project(x, c["z"]).reshape(T, HV, V)  # output-gate input

    A = np.exp(c["A_log"])  # [HV]
    if fam.kda:
        u = f.reshape(T, H, K) + c["dt_bias"].reshape(H, K)
        if fam.lower_bound is not None:
            g = fam.lower_bound * sigmoid(A[None, :, None] * u)
        else:
            g = -A[None, :, None] * softplus(u)
        if fam.round_gate:
            g = rnd(g)
        g_full = g  # [T, H, K]
    else:
        g = -A[None, :] * softplus(f + c["dt_bias"][None, :])  # [T, HV]
        g_full = np.repeat(g[:, :, None], K, axis=2)
    beta = fam.beta_scale * sigmoid(b)  # [T, HV]

    mixed = np.zeros((T, fam.conv_dim))  # after conv + SiLU
    o = np.zeros((T, HV, V))
    rec = np.zeros((N, HV, K, V))
    tails = np.zeros((N, W - 1, fam.conv_dim))
    for n in range(N):
        s, e = int(cu[n]), int(cu[n + 1])
        tail = np.zeros((W - 1, fam.conv_dim)) if conv0 is None else rnd(np.asarray(conv0[n], dtype=np.float64))
        full = np.concatenate([tail, qkv[s:e]], axis=0)  # [W-1+len, C]
        y = np.zeros((e - s, fam.conv_dim))
        for j in range(W):
            y += conv_w[:, j][None, :] * full[j:j + e - s]
        mixed[s:e] = rnd(silu(y))
        tails[n] = full[full.shape[0] - (W - 1):]  # shorter than W-1 tokens: the old tail shifted
        S = np.zeros((HV, K, V)) if rec0 is None else np.asarray(rec0[n], dtype=np.float64)
        o[s:e], rec[n] = delta_rule(mixed[s:e, :kd].reshape(-1, H, K), mixed[s:e, kd:2 * kd].reshape(-1, H, K),
                                    mixed[s:e, 2 * kd:].reshape(-1, HV, V), g_full[s:e], beta[s:e], S)

    o = rnd(o)
    act = sigmoid if fam.out_act == "sigmoid" else silu
    rstd = 1.0 / np.sqrt((o * o).mean(-1, keepdims=True) + fam.norm_eps)
    y = rnd(o * rstd * c["norm"][None, None, :] * act(z))  # [T, HV, V]
    out = rnd(y.reshape(T, HV * V) @ c["out"].T)
    inter = {"q_conv": mixed[:, :kd].reshape(T, H, K), "k_conv": mixed[:, kd:2 * kd].reshape(T, H, K),
             "v_conv": mixed[:, 2 * kd:].reshape(T, HV, V), "beta": beta}
    if fam.kda:
        inter.update(g_raw=f.reshape(T, H, K), g=g, o_kda=o, g_out=z)
    else:
        inter.update(g_raw=f, g=g, o_gdn=o, z=z)
    return out, rec, tails, inter


# -------------------------------------------------------------------------------------------- sets

# A set's cases: (name, sequence lengths, with initial states).
CASES = [
    ("single_T1", [1], False),
    ("single_T65", [65], False),
    ("single_T130", [130], False),
    ("varlen_unbalanced_5_17_1_41", [5, 17, 1, 41], False),
    ("varlen_initstate", [5, 17, 1, 41], True),
]
# The Kimi-Linear, Qwen3-Next and Qwen3.5 sets: the cases (names, lengths) that the independent sets of
# ../shared/golden hold, so that a clone without them runs every test on these.
MINI_CASES = [(f"single_T{t}", [t], False) for t in (1, 8, 64, 65, 128)] + [
    ("varlen_balanced_4x32", [32] * 4, False),
    ("varlen_unbalanced_5_17_1_41", [5, 17, 1, 41], False),
    ("single_T128_initstate", [128], True),
    ("varlen_initstate", [5, 17, 1, 41], True),
]
KDA_MINI_CASES = MINI_CASES + [("single_T256", [256], False), ("single_T1024", [1024], False),
                               ("varlen_single_T128", [128], False)]
GDN_MINI_CASES = MINI_CASES + [("single_T300", [300], False), ("varlen_initstate_short_1_2_3_70", [1, 2, 3, 70], True)]
GVA_CASES = [("single_T1", [1], False), ("single_T65", [65], False), ("single_T200", [200], False),
             ("varlen_unbalanced_5_17_1_41", [5, 17, 1, 41], False), ("single_T128_initstate", [128], True),
             ("varlen_initstate", [5, 17, 1, 41], True)]
STRESS_CASES = [("stress_T64", [64], False), ("stress_T300", [300], False),
                ("stress_varlen_initstate", [100, 1, 63, 200], True)]


def loud_cases(varlen):
    return [("loud_T128", [128], False), ("loud_T300", [300], False), ("loud_varlen", varlen, False),
            ("loud_varlen_initstate", [5, 17, 1, 41], True)]


# set: (family, make_weights arguments, seed, cases). Small shapes; gates that exercise each variant.
SETS = {
    # KDA, lower bound -5 reached (g down to -5 within bf16 precision), low-rank gates.
    "glm5-mini": (lambda: Glm5Next(hidden=128, H=4, HV=4, K=32, V=32, eps=1e-5), dict(gates="bound"), 20261301,
                  CASES),
    # KDA, full-rank gates, the activated gate rounded to bf16; v 4x louder (o^2 well above eps).
    "bailing-mini": (lambda: BailingHybrid(hidden=256, H=4, HV=4, K=32, V=32, eps=1e-6),
                     dict(gates="bound", v_scale=4.0), 20261302, CASES),
    # GDN, V = 2K, beta = 2 sigmoid(b) up to 2 (negative eigenvalues), norm eps 1e-5.
    "olmo-mini": (lambda: OlmoHybrid(hidden=128, H=2, HV=2, K=32, V=64, eps=1e-6, norm_eps=1e-5),
                  dict(gates="mild", b_std=0.3), 20261303, CASES),
    # GDN, GVA 2, fused in_proj; linear layers 0 and 2 (period-5 pattern).
    "lara-mini": (lambda: LaraMini(hidden=128, H=2, HV=4, K=32, V=32, eps=1e-6), dict(gates="mild"), 20261304,
                  CASES),
    # GDN, GVA 2, sigmoid output gate, transformers' init gates (down to about -20); v 4x louder.
    "qwen4-mini": (lambda: Qwen4Exp(hidden=128, H=2, HV=4, K=32, V=32, eps=1e-6),
                   dict(gates="init", v_scale=4.0), 20261305, CASES),
    # Kimi-Linear (the design's shapes: hidden 512, 4 heads x 128): mild gates; trained-like gates down to about
    # -250 per token; v 30x louder (mean o^2 far above the norm's eps).
    "kda-mini": (lambda: KimiLinear(hidden=512, H=4, HV=4, K=128, V=128, eps=1e-5), dict(gates="mild"), 20261306,
                 KDA_MINI_CASES),
    "kda-stress": (lambda: KimiLinear(hidden=512, H=4, HV=4, K=128, V=128, eps=1e-5), dict(gates="stress"),
                   20261307, STRESS_CASES),
    "kda-loud": (lambda: KimiLinear(hidden=512, H=4, HV=4, K=128, V=128, eps=1e-5),
                 dict(gates="mild", v_scale=30.0), 20261308, loud_cases([5, 17, 1, 41, 64])),
    # Qwen3-Next (interleaved projections), GVA 2; Qwen3.5 (flat), GVA 3 with K != V; Qwen3-Next with
    # transformers' init gates (down to about -20 per token) and v 30x louder.
    "gdn-mini": (lambda: Qwen3Next(hidden=256, H=4, HV=8, K=32, V=32, eps=1e-6), dict(gates="mild"), 20261309,
                 GDN_MINI_CASES),
    "gdn-gva3": (lambda: Qwen35Text(hidden=256, H=2, HV=6, K=64, V=48, eps=1e-6), dict(gates="mild"), 20261310,
                 GVA_CASES),
    "gdn-loud": (lambda: Qwen3Next(hidden=512, H=2, HV=4, K=128, V=128, eps=1e-6),
                 dict(gates="init", v_scale=30.0), 20261311, loud_cases([37, 60, 1, 30])),
    # Kimi-Linear-48B's layer shapes (hidden 2304, 32 heads x 128), one small packed batch with initial states;
    # the checkpoint in two shards with Hugging Face's index.
    "kda-real": (lambda: KimiLinear(hidden=2304, H=32, HV=32, K=128, V=128, eps=1e-5), dict(gates="mild"), 20261312,
                 [("real_varlen_initstate", [7, 70, 1, 42], True)]),
}
# Sets whose checkpoint is written in this many shards (model-0000i-of-0000n.safetensors + index); else one file.
SHARDS = {"kda-real": 2}


def case_inputs(rng, lens, hidden, state, init):
    """A case's boundaries cu [N+1] (int32), its rows x [T, hidden] (bf16 values) and, with init, initial
    recurrent states [N, *state] (fp32 values, N(0, 0.5)), drawn in that order; else None."""
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    x = bf16(rng.normal(0.0, 1.0, (int(cu[-1]), hidden)))
    rec0 = rng.normal(0.0, 0.5, (len(lens), *state)).astype(np.float32).astype(np.float64) if init else None
    return cu, x, rec0


def case_tensors(fam: Family, c: dict, lens, init: bool, rng: np.random.Generator) -> dict:
    """A case's tensors (float64; written as F32, cu_seqlens I32):
      hidden_states [T, hidden] (bf16-exact), cu_seqlens [N+1];
      initial_recurrent_state [N, HV, K, V], initial_conv_state [N, W-1, C] (bf16-exact), only with init;
      out_fp32, out_bf16 [T, hidden]; final_recurrent_state [N, HV, K, V] and final_conv_state [N, W-1, C]
      (fp32 pipeline); final_recurrent_state_bf16 [N, HV, K, V];
      q_conv, k_conv [T, H, K], v_conv [T, HV, V] (after conv + SiLU, before the L2 norm), beta [T, HV];
      KDA: g_raw, g [T, H, K] (gate projection before dt_bias; activated gate), o_kda, g_out [T, H, V];
      GDN: g_raw, g [T, HV] (a; activated gate), o_gdn, z [T, HV, V] (kernel output; output-gate input);
      intermediates from the fp32 pipeline."""
    cu, x, rec0 = case_inputs(rng, lens, fam.hidden, (fam.HV, fam.K, fam.V), init)
    N = len(lens)
    conv0 = bf16(rng.normal(0.0, 0.45, (N, fam.W - 1, fam.conv_dim))) if init else None
    out, rec, tails, inter = forward(fam, c, x, cu, rec0, conv0)
    out16, rec16, _, _ = forward(fam, c, x, cu, rec0, conv0, bf16_pipeline=True)
    t = {"hidden_states": x, "cu_seqlens": cu, "out_fp32": out, "out_bf16": out16, "final_recurrent_state": rec,
         "final_conv_state": tails, "final_recurrent_state_bf16": rec16, **inter}
    if init:
        t["initial_recurrent_state"] = rec0
        t["initial_conv_state"] = conv0
    return t


def load_layer(dirname: str, fam: Family, layer: int = 0) -> dict:
    """Canonical weights of one layer of a written set (its model.safetensors, or its shards)."""
    p = f"{fam.root}{layer}.{fam.prefix}"
    files = sorted(f for f in os.listdir(dirname) if f.startswith("model") and f.endswith(".safetensors"))
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(dirname, f)))
    return fam.from_checkpoint({k[len(p):]: v for k, v in w.items() if k.startswith(p)})


def write_set(set_name: str, outdir: str, quiet: bool = False) -> None:
    make_family, wargs, seed, cases = SETS[set_name]
    fam = make_family()
    rng = np.random.default_rng(seed)
    os.makedirs(outdir, exist_ok=True)
    tensors, f32 = {}, set()
    for i in fam.linear_layers():
        named = fam.to_checkpoint(make_weights(fam, rng, **wargs))
        for k, v in named.items():
            tensors[f"{fam.root}{i}.{fam.prefix}{k}"] = v
            if k in fam.f32_names():
                f32.add(f"{fam.root}{i}.{fam.prefix}{k}")
    shards = SHARDS.get(set_name, 1)
    if shards == 1:
        write_safetensors(os.path.join(outdir, "model.safetensors"), tensors, bf16_names=set(tensors) - f32,
                          meta={"format": "pt"})
    else:
        names, weight_map = sorted(tensors), {}
        for i in range(shards):
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[i::shards]}
            write_safetensors(os.path.join(outdir, fname), part, bf16_names=set(part) - f32, meta={"format": "pt"})
            weight_map.update({n: fname for n in part})
        with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
            f.write("\n")
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(fam.config(), f, indent=2)
        f.write("\n")
    c = load_layer(outdir, fam, fam.linear_layers()[0])  # what the checkpoint holds, read back
    for name, lens, init in cases:
        t = case_tensors(fam, c, lens, init, rng)
        write_case(outdir, set_name, name, t, fam.linear_layers()[0], fam.model_type, quiet,
                   lambda t=t: f"mean(o^2)={(t['o_kda' if fam.kda else 'o_gdn'] ** 2).mean():.3g} "
                               f"min g={t['g'].min():.6g} beta in [{t['beta'].min():.3f}, {t['beta'].max():.3f}]")


def write_case(outdir, set_name, name, t, layer, model_type, quiet, summary) -> None:
    """One case file of a set (its metadata: the case, the layer, the model type) and, unless quiet, a line of
    its numbers: T, max|out|, summary() and the bf16 pipeline's distance from the exact output."""
    write_safetensors(os.path.join(outdir, f"{name}.safetensors"), t,
                      meta={"case": name, "layer": str(layer), "model_type": model_type})
    if not quiet:
        rel = np.linalg.norm(t["out_bf16"] - t["out_fp32"]) / np.linalg.norm(t["out_fp32"])
        print(f"{set_name}/{name}: T={len(t['hidden_states'])} max|out|={np.abs(t['out_fp32']).max():.3g} "
              f"{summary()} bf16 relL2={rel:.2e}")


def selfcheck(set_name: str) -> None:
    """Split prefill + decode steps against one prefill (float64): the tails and states carry."""
    make_family, wargs, seed, _ = SETS[set_name]
    fam = make_family()
    rng = np.random.default_rng(seed)
    c = make_weights(fam, rng, **wargs)
    x = bf16(rng.normal(0.0, 1.0, (40, fam.hidden)))
    out, rec, tails, _ = forward(fam, c, x, [0, 40])
    o1, r1, t1, _ = forward(fam, c, x[:30], [0, 30])
    outs = [o1]
    for i in range(30, 38):  # decode steps
        o2, r1, t1, _ = forward(fam, c, x[i:i + 1], [0, 1], r1, t1)
        outs.append(o2)
    o3, r1, t1, _ = forward(fam, c, x[38:], [0, 2], r1, t1)  # shorter than W-1: the old tail shifted
    outs.append(o3)
    err = max(np.abs(np.concatenate(outs) - out).max() / np.abs(out).max(), np.abs(r1 - rec).max() / np.abs(rec).max(),
              np.abs(t1 - tails).max() / np.abs(tails).max())
    print(f"{set_name}: split prefill + decode vs prefill: max relative difference {err:.2e}")
    assert err < 1e-12


def golden_cli(argv, doc, sets, write, check):
    """The command line of a golden-set writer (this one's and tools/mamba2_ref.py's): OUTDIR --set NAME
    (or --all), --selfcheck (check(name) first), --quiet; write(name, directory, quiet) writes a set."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("outdir", help="the set's directory (with --set) or their parent (with --all)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--set", choices=sorted(sets), help="write one golden set into outdir")
    g.add_argument("--all", action="store_true", help="write every set into outdir/<set>")
    ap.add_argument("--selfcheck", action="store_true", help="also check split prefill + decode (float64)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    names = sorted(sets) if args.all else [args.set]
    for name in names:
        if args.selfcheck:
            check(name)
        write(name, os.path.join(args.outdir, name) if args.all else args.outdir, args.quiet)
    if not args.quiet:
        print(f"{len(names)} set(s) in {time.time() - t0:.2f} s")


if __name__ == "__main__":
    golden_cli(sys.argv[1:], __doc__, SETS, write_set, selfcheck)
