#!/usr/bin/python3
"""Float64 reference for one Mamba2 mixer layer of the hybrid families, and the writer of their golden sets.

The families (transformers 5.25 mixer classes; checkpoint tensor names as the original checkpoints hold them):

  set            model_type        mixers                                   layer under
  mamba2-mini    nemotron_h        hybrid_override_pattern "M-M*M-":        backbone.layers.{i}.mixer.
                                   'M' layers (0, 2, 4)                     (transformers renames backbone. to
                                                                            model. on load, back on save)
  mamba2-groups  mamba2            every layer (2)                          backbone.layers.{i}.mixer.
  mamba2-loud    granitemoehybrid  layer_types "mamba" (0, 1, 3 of          model.layers.{i}.mamba.
                                   mamba, mamba, attention, mamba)
  mamba2-falcon  falcon_h1         every layer (2; each beside an attention  model.layers.{i}.mamba.
                                   block, not part of this layer)
  mamba2-zamba   zamba2            every layer: "hybrid" (0: a shared       model.layers.{i}.mamba_decoder.mamba.
                                   attention block, then the mixer) and     (hybrid), model.layers.{i}.mamba.
                                   "mamba" (1, 2)
  (read only)    bamba             the layers not in attn_layer_indices     model.layers.{i}.mamba.

Each family's config.json names the mixer's sizes its own way (MixerConfig.read: num_heads / mamba_num_heads /
mamba_n_heads, ...). Falcon-H1's variants: in_proj's input times ssm_in_multiplier and its output parts z, x, B,
C, dt times ssm_multipliers (mult below: their products, the parts as float32 values); the gated norm only with
mamba_rms_norm (else y * silu(z), no norm.weight), rms(y) * weight * silu(z) with mamba_norm_before_gate
(norm="norm_then_gate" below). Zamba2: dt clamped to (time_step_min, inf), the norm's eps 1e-5.

Shapes: H heads of P dims, state size N, G groups of B and C (head h reads group h // (H/G)), I = H*P,
conv_dim = I + 2*G*N (channels x|B|C), W the conv width, T tokens, S sequences. Checkpoint tensors of a mixer:
in_proj.weight [2I + 2GN + H, hidden] (rows z | x | B | C | dt), conv1d.weight [conv_dim, 1, W], conv1d.bias
[conv_dim], dt_bias, A_log, D [H], norm.weight [I], out_proj.weight [hidden, I] (in_proj.bias and out_proj.bias
where the config asks for them).

The layer, per sequence (a batch packs sequences along T; cu_seqlens [S+1] gives the boundaries):

  z | xBC | dt_raw = (x W_in^T) * mult             [T, I], [T, conv_dim], [T, H]; mult per part (1 but Falcon-H1)
  x | B | C = silu(causal depthwise conv_W(xBC) + conv1d.bias)   tap W-1 multiplies the current token; rows
              before the sequence start come from its conv tail [W-1, conv_dim] (raw projection outputs, oldest
              first; zeros for a fresh sequence), never from a neighbouring sequence
  dt     = clamp(softplus(dt_raw + dt_bias), time_step_limit)    [T, H]; softplus(u) = u for u > 20 (torch)
  A      = -exp(A_log)                                            [H]
  h_t    = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T                   per head, h [P, N]; B_t, C_t of the head's group
  y_t    = h_t C_t + D x_t                                        [H, P]
  y_norm = g * rsqrt(mean(g^2) + eps) * norm.weight,  g = y * silu(z),  the mean over groups of I/G channels
           (H/G heads together); eps: layer_norm_epsilon (mamba2, nemotron_h) or rms_norm_eps (1e-5 in zamba2);
           norm_then_gate: y * rsqrt(mean(y^2) + eps) * norm.weight * silu(z); gate_only: g
  out    = y_norm W_out^T

The recurrent state per sequence is [H, P, N] (transformers' cache layout, no transpose); the conv tail
[W-1, conv_dim] is the last W-1 raw xBC projection outputs (transformers' [conv_dim, W] conv state: its columns
1..W-1, transposed).

fp32 pipeline: the maths above in float64 (the exact answer; no casts).
bf16 pipeline (`bf16=True`), the cast points of the delta-rule layers carried over:
  bf16: weights, x, the in_proj output (fp32 accumulation times mult, rounded once), the conv output after bias and SiLU
        (rounded once), the scan output y (D skip included), the gated-norm output, the out_proj output, the conv
        tail (an initial conv state is rounded too).
  fp32: dt (softplus of the bf16 dt_raw + dt_bias, clamp), A, the state and all scan arithmetic, the gated-norm
        arithmetic (silu(z) product, mean square, rsqrt and weight in one expression).
  The "fp32" quantities are computed in float64: the bf16 answer is the exact result of a pipeline whose only
  errors are those roundings.

A golden set (`python3 tools/mamba2_ref.py OUTDIR --set mamba2-mini`): config.json in Hugging Face form (the
family's own field names), model.safetensors with every mixer layer's weights (BF16) and one safetensors file
per case, computed for the first mixer layer (see SETS and case_tensors()); each set from a fixed seed, byte
for byte the same on every run. For tests: Layer.from_dir(set_dir).forward(...) and recurrent(...). Debian's
python3 with numpy; no torch.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from delta_rule_ref import (bf16, case_inputs, golden_cli, read_safetensors, silu, softplus, write_case,  # noqa: E402
                            write_safetensors)

_bf16 = bf16  # Layer.forward's argument `bf16` shadows the name there

# ------------------------------------------------------------------------------------------ configs


class MixerConfig:
    """One mixer's geometry and settings (family-independent names) and the config.json field names of the
    family that holds it. A family's subclass reads its config.json (read), writes one (config) and names where
    its mixer layers sit (mixer_layers, prefix)."""

    model_type = ""
    architecture = ""
    root = "model.layers."  # layer i's mixer tensors: root + f"{i}." + module + name
    module = "mamba."

    def __init__(self, hidden, H, P, N, G=1, W=4, eps=1e-5, conv_bias=True, proj_bias=False,
                 dt_limit=(0.0, math.inf), layers=None, in_mult=1.0, parts=(1.0,) * 5, norm="gate_then_norm"):
        assert H % G == 0, "the heads must split evenly into the groups"
        assert norm in ("gate_then_norm", "norm_then_gate", "gate_only"), norm
        self.hidden, self.H, self.P, self.N, self.G, self.W = hidden, H, P, N, G, W
        self.eps, self.conv_bias, self.proj_bias = eps, conv_bias, proj_bias
        self.dt_limit = (float(dt_limit[0]), float(dt_limit[1]))
        self.layers = layers  # the family's layer pattern (its own spelling), for config()
        # Falcon-H1's: ssm_in_multiplier, ssm_multipliers [z, x, B, C, dt] and the norm's form.
        self.in_mult, self.parts, self.norm = float(in_mult), tuple(float(p) for p in parts), norm

    @property
    def mult(self):
        """The factor of each in_proj row [proj_dim]: ssm_in_multiplier times its part's multiplier (a float32
        value, as transformers keeps them)."""
        sizes = (self.inner, self.inner, self.G * self.N, self.G * self.N, self.H)
        return np.concatenate([np.full(n, self.in_mult * float(np.float32(p))) for n, p in zip(sizes, self.parts)])

    @property
    def inner(self):  # I
        return self.H * self.P

    @property
    def conv_dim(self):
        return self.inner + 2 * self.G * self.N

    @property
    def proj_dim(self):  # rows of in_proj
        return 2 * self.inner + 2 * self.G * self.N + self.H

    def prefix(self, layer: int) -> str:
        return f"{self.root}{layer}.{self.module}"

    def mixer_layers(self) -> list[int]:
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError

    @classmethod
    def read(cls, cfg: dict) -> MixerConfig:
        raise NotImplementedError

    def common(self, n_layers: int, **fields) -> dict:
        """The fields outside the mixer (the model around it; not part of this layer)."""
        return {"architectures": [self.architecture], "model_type": self.model_type, "hidden_size": self.hidden,
                "num_hidden_layers": n_layers, **fields, "vocab_size": 1024, "torch_dtype": "bfloat16"}

    @staticmethod
    def limit(cfg: dict):
        lo, hi = cfg.get("time_step_limit", (0.0, math.inf))
        return float(lo), float(hi)

    @staticmethod
    def silu_only(act: str) -> None:
        if act != "silu":
            raise NotImplementedError(f"conv activation {act!r}: only silu is implemented")


class Mamba2(MixerConfig):
    model_type, architecture = "mamba2", "Mamba2ForCausalLM"
    root, module = "backbone.layers.", "mixer."

    def mixer_layers(self):
        return list(range(self.layers))

    def config(self):
        assert self.inner % self.hidden == 0, "mamba2 validates expand * hidden_size == num_heads * head_dim"
        return self.common(
            self.layers, num_heads=self.H, head_dim=self.P, state_size=self.N, n_groups=self.G,
            expand=self.inner // self.hidden, conv_kernel=self.W, use_conv_bias=self.conv_bias,
            use_bias=self.proj_bias, hidden_act="silu", layer_norm_epsilon=self.eps, chunk_size=256,
            residual_in_fp32=True, tie_word_embeddings=False)

    @classmethod
    def read(cls, cfg):
        cls.silu_only(cfg.get("hidden_act", "silu"))
        return cls(cfg["hidden_size"], cfg["num_heads"], cfg["head_dim"], cfg["state_size"], cfg.get("n_groups", 1),
                   cfg.get("conv_kernel", 4), cfg.get("layer_norm_epsilon", 1e-5), cfg.get("use_conv_bias", True),
                   cfg.get("use_bias", False), cls.limit(cfg), cfg["num_hidden_layers"])


class NemotronH(MixerConfig):
    """Nemotron-H: I = mamba_num_heads * mamba_head_dim (expand unused); `layers` the hybrid_override_pattern
    ('M' Mamba2, '*' attention, '-' MLP, 'E' MoE)."""
    model_type, architecture = "nemotron_h", "NemotronHForCausalLM"
    root, module = "backbone.layers.", "mixer."

    def mixer_layers(self):
        return [i for i, c in enumerate(self.layers) if c == "M"]

    def config(self):
        return self.common(
            len(self.layers), hybrid_override_pattern=self.layers, mamba_num_heads=self.H, mamba_head_dim=self.P,
            ssm_state_size=self.N, n_groups=self.G, conv_kernel=self.W, use_conv_bias=self.conv_bias,
            use_bias=self.proj_bias, mamba_hidden_act="silu", layer_norm_epsilon=self.eps, chunk_size=128,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512, mlp_hidden_act="relu2")

    @classmethod
    def read(cls, cfg):
        cls.silu_only(cfg.get("mamba_hidden_act", "silu"))
        if "hybrid_override_pattern" in cfg:
            pattern = cfg["hybrid_override_pattern"]
        else:  # the newer spelling: one block type per layer
            pattern = "".join("M" if t == "mamba" else "-" for t in cfg["layers_block_type"])
        return cls(cfg["hidden_size"], cfg["mamba_num_heads"], cfg["mamba_head_dim"], cfg["ssm_state_size"],
                   cfg.get("n_groups", 1), cfg.get("conv_kernel", 4), cfg.get("layer_norm_epsilon", 1e-5),
                   cfg.get("use_conv_bias", True), cfg.get("use_bias", False), cls.limit(cfg), pattern)


class GraniteMoeHybrid(MixerConfig):
    """Granite-4.0-H: I = mamba_expand * hidden_size; mamba_d_head "auto" = I / mamba_n_heads; the gated norm's eps
    is rms_norm_eps (default 1e-6); `layers` the layer_types ("mamba" or transformers' "linear_attention")."""
    model_type, architecture = "granitemoehybrid", "GraniteMoeHybridForCausalLM"
    default_eps = 1e-6

    def mixer_layers(self):
        return [i for i, t in enumerate(self.layers) if t in ("mamba", "linear_attention")]

    def mamba_fields(self):
        assert self.inner % self.hidden == 0, "mamba_expand * hidden_size must be num_heads * head_dim"
        return dict(mamba_n_heads=self.H, mamba_d_head=self.P, mamba_d_state=self.N, mamba_n_groups=self.G,
                    mamba_d_conv=self.W, mamba_expand=self.inner // self.hidden, mamba_conv_bias=self.conv_bias,
                    mamba_proj_bias=self.proj_bias, mamba_chunk_size=256, hidden_act="silu", rms_norm_eps=self.eps,
                    num_attention_heads=4, num_key_value_heads=2)

    def config(self):
        return self.common(len(self.layers), layer_types=self.layers, **self.mamba_fields(), intermediate_size=512,
                           shared_intermediate_size=512, num_local_experts=0, num_experts_per_tok=0)

    @classmethod
    def pattern(cls, cfg):
        return cfg["layer_types"]

    @classmethod
    def read(cls, cfg):
        cls.silu_only(cfg.get("hidden_act", "silu"))
        hidden, H = cfg["hidden_size"], cfg["mamba_n_heads"]
        inner = cfg.get("mamba_expand", 2) * hidden
        P = cfg.get("mamba_d_head", "auto")
        P = inner // H if P == "auto" else P
        if H * P != inner:
            raise ValueError(f"mamba_n_heads * mamba_d_head = {H * P} is not mamba_expand * hidden_size = {inner}")
        return cls(hidden, H, P, cfg.get("mamba_d_state", 256), cfg.get("mamba_n_groups", 1),
                   cfg.get("mamba_d_conv", 4), cfg.get("rms_norm_eps", cls.default_eps),
                   cfg.get("mamba_conv_bias", True), cfg.get("mamba_proj_bias", False), cls.limit(cfg),
                   cls.pattern(cfg))


class Bamba(GraniteMoeHybrid):
    """Bamba: Granite's mixer fields; the attention layers listed in attn_layer_indices; rms_norm_eps 1e-5."""
    model_type, architecture = "bamba", "BambaForCausalLM"
    default_eps = 1e-5

    def config(self):
        return self.common(len(self.layers), attn_layer_indices=[i for i, t in enumerate(self.layers) if t != "mamba"],
                           **self.mamba_fields(), intermediate_size=512)

    @classmethod
    def pattern(cls, cfg):
        attn = set(cfg.get("attn_layer_indices") or [])
        return ["attention" if i in attn else "mamba" for i in range(cfg["num_hidden_layers"])]


class FalconH1(GraniteMoeHybrid):
    """Falcon-H1: Granite's mixer fields but I = mamba_d_ssm (default 1024; null: mamba_expand * hidden_size),
    rms_norm_eps 1e-5, out_proj's bias projectors_bias; every layer a mixer (beside its attention); the
    multipliers and the norm's form (mamba_rms_norm default false, mamba_norm_before_gate default true)."""
    model_type, architecture = "falcon_h1", "FalconH1ForCausalLM"
    default_eps = 1e-5

    def mixer_layers(self):
        return list(range(self.layers))

    def config(self):
        f = self.mamba_fields()
        del f["mamba_expand"]
        return self.common(
            self.layers, **f, mamba_d_ssm=self.inner, mamba_rms_norm=self.norm != "gate_only",
            mamba_norm_before_gate=self.norm == "norm_then_gate", ssm_in_multiplier=self.in_mult,
            ssm_multipliers=list(self.parts), projectors_bias=False, intermediate_size=512, head_dim=64)

    @classmethod
    def read(cls, cfg):
        cls.silu_only(cfg.get("hidden_act", "silu"))
        hidden, H = cfg["hidden_size"], cfg.get("mamba_n_heads", 128)
        inner = cfg.get("mamba_d_ssm", 1024)
        inner = cfg.get("mamba_expand", 2) * hidden if inner is None else inner
        P = cfg.get("mamba_d_head", "auto")
        P = inner // H if P == "auto" else P
        if H * P != inner:
            raise ValueError(f"mamba_n_heads * mamba_d_head = {H * P} is not the mixer's width {inner}")
        if cfg.get("mamba_proj_bias", False) or cfg.get("projectors_bias", False):
            raise NotImplementedError("biased in_proj / out_proj")
        norm = ("gate_only" if not cfg.get("mamba_rms_norm", False)
                else "norm_then_gate" if cfg.get("mamba_norm_before_gate", True) else "gate_then_norm")
        return cls(hidden, H, P, cfg.get("mamba_d_state", 256), cfg.get("mamba_n_groups", 1),
                   cfg.get("mamba_d_conv", 4), cfg.get("rms_norm_eps", cls.default_eps),
                   cfg.get("mamba_conv_bias", True), False, cls.limit(cfg), cfg["num_hidden_layers"],
                   cfg.get("ssm_in_multiplier", 1.0), cfg.get("ssm_multipliers") or (1.0,) * 5, norm)


class Zamba2(MixerConfig):
    """Zamba2: I = mamba_expand * hidden_size, the head dim I / n_mamba_heads; eps 1e-5 and the conv bias fixed;
    dt clamped to (time_step_min, inf); `layers` the layers_block_type ("mamba" / "linear_attention" a mixer layer,
    "hybrid" a shared attention block then a mixer, under mamba_decoder.mamba.)."""
    model_type, architecture = "zamba2", "Zamba2ForCausalLM"

    def mixer_layers(self):
        return list(range(len(self.layers)))

    def prefix(self, layer):
        return f"{self.root}{layer}." + ("mamba_decoder.mamba." if self.layers[layer] == "hybrid" else self.module)

    def config(self):
        assert self.inner % self.hidden == 0 and self.eps == 1e-5 and self.conv_bias and self.dt_limit[1] == math.inf
        return self.common(
            len(self.layers), layers_block_type=self.layers, n_mamba_heads=self.H, mamba_d_state=self.N,
            mamba_ngroups=self.G, mamba_d_conv=self.W, mamba_expand=self.inner // self.hidden,
            time_step_min=self.dt_limit[0], add_bias_linear=self.proj_bias, num_attention_heads=4,
            intermediate_size=512, num_mem_blocks=1, use_mem_rope=False)

    @classmethod
    def read(cls, cfg):
        hidden, H = cfg["hidden_size"], cfg.get("n_mamba_heads", 8)
        inner = cfg.get("mamba_expand", 2) * hidden
        if inner % H:
            raise ValueError(f"mamba_expand * hidden_size = {inner} is not a multiple of n_mamba_heads = {H}")
        layers = cfg.get("layer_types") or cfg["layers_block_type"]
        return cls(hidden, H, inner // H, cfg.get("mamba_d_state", 64), cfg.get("mamba_ngroups", 1),
                   cfg.get("mamba_d_conv", 4), 1e-5, True, cfg.get("add_bias_linear", False),
                   (cfg.get("time_step_min", 1e-3), math.inf), layers)


FAMILIES = {f.model_type: f for f in (Mamba2, NemotronH, GraniteMoeHybrid, Bamba, FalconH1, Zamba2)}


def read_config(cfg: dict) -> MixerConfig:
    """The mixer configuration of a config.json (a dict)."""
    mt = cfg.get("model_type", "")
    if mt not in FAMILIES:
        raise NotImplementedError(f"model_type {mt!r}: the Mamba2 families covered are {sorted(FAMILIES)}")
    return FAMILIES[mt].read(cfg)


# ---------------------------------------------------------------------------------------- the layer


def recurrent(x, dt, A, B, C, D, state):
    """The selective scan token by token in float64. x [T, H, P]; dt [T, H] (after softplus and clamp); A [H]
    (negative); B, C [T, G, N]; D [H]; state [H, P, N] (not modified). Head h reads group h // (H/G).
    Returns y [T, H, P] (D skip included) and the final state [H, P, N]."""
    x, dt, B, C = (np.asarray(a, dtype=np.float64) for a in (x, dt, B, C))
    T, H, P = x.shape
    r = H // B.shape[1]
    B, C = np.repeat(B, r, axis=1), np.repeat(C, r, axis=1)  # [T, H, N]
    A, D = np.asarray(A, dtype=np.float64), np.asarray(D, dtype=np.float64)
    h = np.array(state, dtype=np.float64)
    y = np.zeros((T, H, P))
    for t in range(T):
        h = np.exp(dt[t] * A)[:, None, None] * h + (dt[t][:, None] * x[t])[:, :, None] * B[t][:, None, :]
        y[t] = np.einsum("hpn,hn->hp", h, C[t]) + D[:, None] * x[t]
    return y, h


def gated_rmsnorm(y, z, weight, G, eps, norm="gate_then_norm"):
    """y * silu(z), normalised by its RMS over groups of I/G channels, times weight. y, z [T, I]; weight [I].
    norm_then_gate: y normalised, times weight, then times silu(z); gate_only: y * silu(z) (weight unused)."""
    g = y * silu(z)
    if norm == "gate_only":
        return g
    v = y if norm == "norm_then_gate" else g
    vv = v.reshape(v.shape[0], G, -1)
    rstd = 1.0 / np.sqrt((vv * vv).mean(-1, keepdims=True) + eps)
    out = (vv * rstd).reshape(v.shape) * weight[None, :]
    return out * silu(z) if norm == "norm_then_gate" else out


class Output(NamedTuple):
    out: np.ndarray  # [T, hidden]
    recurrent_state: np.ndarray  # [S, H, P, N] after the batch
    conv_state: np.ndarray  # [S, W-1, conv_dim] after the batch
    inter: dict  # the intermediates, under the case tensors' names


class Layer:
    """One Mamba2 mixer: a MixerConfig and its weights under the checkpoint's names (relative to the mixer's
    prefix: in_proj.weight, conv1d.weight, ...), float64."""

    def __init__(self, cfg: MixerConfig, weights: dict):
        self.cfg = cfg
        self.w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
        c = cfg
        shapes = {"in_proj.weight": (c.proj_dim, c.hidden), "conv1d.weight": (c.conv_dim, 1, c.W), "dt_bias": (c.H,),
                  "A_log": (c.H,), "D": (c.H,), "out_proj.weight": (c.hidden, c.inner)}
        if c.norm != "gate_only":
            shapes["norm.weight"] = (c.inner,)
        if c.conv_bias:
            shapes["conv1d.bias"] = (c.conv_dim,)
        if c.proj_bias:
            shapes.update({"in_proj.bias": (c.proj_dim,), "out_proj.bias": (c.hidden,)})
        for k, s in shapes.items():
            if k not in self.w:
                raise KeyError(f"mixer weight {k} missing")
            if self.w[k].shape != s:
                raise ValueError(f"{k}: shape {self.w[k].shape}, expected {s}")

    @classmethod
    def from_dir(cls, dirname: str, layer: int | None = None) -> Layer:
        """Layer `layer` (default: the first mixer layer) of a set's config.json and model.safetensors (or its
        shards)."""
        with open(os.path.join(dirname, "config.json")) as f:
            cfg = read_config(json.load(f))
        layer = cfg.mixer_layers()[0] if layer is None else layer
        if layer not in cfg.mixer_layers():
            raise ValueError(f"layer {layer} is not a Mamba2 mixer (mixers: {cfg.mixer_layers()})")
        p = cfg.prefix(layer)
        w = {}
        for f in sorted(os.listdir(dirname)):
            if f.startswith("model") and f.endswith(".safetensors"):
                w.update({k[len(p):]: v for k, v in read_safetensors(os.path.join(dirname, f)).items()
                          if k.startswith(p)})
        return cls(cfg, w)

    def forward(self, hidden_states, cu_seqlens, initial_recurrent_state=None, initial_conv_state=None,
                bf16: bool = False) -> Output:
        """The mixer over a packed batch. hidden_states [T, hidden]; cu_seqlens [S+1]; initial states
        [S, H, P, N] and [S, W-1, conv_dim] (None: zeros). Returns Output (float64 arrays); the intermediates
        z, x_conv [T, H, P], B_conv, C_conv [T, G, N], dt_raw, dt, log_decay [T, H], y_ssm, y_norm [T, H, P]."""
        c, w = self.cfg, self.w
        rnd = _bf16 if bf16 else (lambda a: a)  # a cast point
        weight = (lambda k: _bf16(w[k])) if bf16 else (lambda k: w[k])
        H, P, N, G, W, I, cd = c.H, c.P, c.N, c.G, c.W, c.inner, c.conv_dim
        x = rnd(np.asarray(hidden_states, dtype=np.float64))
        cu = [int(v) for v in cu_seqlens]
        T, S = x.shape[0], len(cu) - 1
        assert cu[0] == 0 and cu[-1] == T and all(a <= b for a, b in zip(cu, cu[1:])), "bad cu_seqlens"

        zxbcdt = x @ weight("in_proj.weight").T
        if c.proj_bias:
            zxbcdt = zxbcdt + weight("in_proj.bias")
        zxbcdt = rnd(zxbcdt * c.mult[None, :])
        z, xbc, dt_raw = zxbcdt[:, :I], zxbcdt[:, I:I + cd], zxbcdt[:, I + cd:]

        dt = np.clip(softplus(dt_raw + weight("dt_bias")[None, :]), *c.dt_limit)  # [T, H]
        A = -np.exp(weight("A_log"))  # [H]
        D = weight("D")
        conv_w = weight("conv1d.weight").reshape(cd, W)
        conv_b = weight("conv1d.bias") if c.conv_bias else np.zeros(cd)

        xbc_act = np.zeros((T, cd))
        y = np.zeros((T, H, P))
        rec = np.zeros((S, H, P, N))
        tails = np.zeros((S, W - 1, cd))
        for n in range(S):
            s, e = cu[n], cu[n + 1]
            tail = np.zeros((W - 1, cd)) if initial_conv_state is None else rnd(
                np.asarray(initial_conv_state[n], dtype=np.float64))
            full = np.concatenate([tail, xbc[s:e]], axis=0)  # [W-1+len, conv_dim], oldest first
            acc = np.broadcast_to(conv_b, (e - s, cd)).copy()
            for j in range(W):
                acc += conv_w[:, j][None, :] * full[j:j + e - s]
            xbc_act[s:e] = rnd(silu(acc))
            tails[n] = full[full.shape[0] - (W - 1):]  # fewer than W-1 tokens: the old tail shifted
            h0 = np.zeros((H, P, N)) if initial_recurrent_state is None else initial_recurrent_state[n]
            xs = xbc_act[s:e]
            y[s:e], rec[n] = recurrent(xs[:, :I].reshape(-1, H, P), dt[s:e], A,
                                       xs[:, I:I + G * N].reshape(-1, G, N), xs[:, I + G * N:].reshape(-1, G, N),
                                       D, h0)

        y = rnd(y)
        y_norm = rnd(gated_rmsnorm(y.reshape(T, I), z, weight("norm.weight") if c.norm != "gate_only" else None, G,
                                   c.eps, c.norm))
        out = y_norm @ weight("out_proj.weight").T
        if c.proj_bias:
            out = out + weight("out_proj.bias")
        out = rnd(out)
        inter = {"z": z.reshape(T, H, P), "x_conv": xbc_act[:, :I].reshape(T, H, P),
                 "B_conv": xbc_act[:, I:I + G * N].reshape(T, G, N), "C_conv": xbc_act[:, I + G * N:].reshape(T, G, N),
                 "dt_raw": dt_raw, "dt": dt, "log_decay": dt * A[None, :], "y_ssm": y,
                 "y_norm": y_norm.reshape(T, H, P)}
        return Output(out, rec, tails, inter)


# -------------------------------------------------------------------------------------------- weights


def make_weights(c: MixerConfig, rng: np.random.Generator, gates: str, proj_scale: float = 1.0,
                 std: float = 0.02) -> dict:
    """One mixer's random weights under the checkpoint's names; every value bf16-exact.

    gates (dt = softplus(dt_raw + dt_bias), per-step decay exp(dt A)):
      "mild":  A = U(1, 16), dt_bias = softplus^-1(dt) with dt log-uniform in [1e-3, 1e-1], dt rows of in_proj of
               std `std`: dt A in about [-2, 0), median about -0.05 (mamba2-mini).
      "init":  Mamba2's init: A = 1..H, dt_bias as in "mild": dt A in about [-1.5, 0) (mamba2-groups).
      "loud":  Granite's / Bamba's init: dt_bias = 1, A = 1..H, dt rows of std 0.1 (dt_raw std about 1.6): dt up to
               about 7, dt A down to about -110, median about -9, two thirds below -5 (mamba2-loud).
    proj_scale enlarges the z, x, B and C rows of in_proj (the scan output grows with its cube)."""
    h, H, I, GN = c.hidden, c.H, c.inner, c.G * c.N

    def normal(shape, s):
        return bf16(rng.normal(0.0, s, shape))

    rows = normal((2 * I + 2 * GN, h), std * proj_scale)  # z | x | B | C
    dt_rows = normal((H, h), 0.1 if gates == "loud" else std)
    w = {"in_proj.weight": np.concatenate([rows, dt_rows], axis=0),
         "conv1d.weight": normal((c.conv_dim, 1, c.W), 0.4)}
    if c.conv_bias:
        w["conv1d.bias"] = normal((c.conv_dim,), 0.1)
    if gates == "mild":
        A = rng.uniform(1.0, 16.0, H)
    else:
        A = np.arange(1.0, H + 1.0)
    w["A_log"] = bf16(np.log(A))
    if gates == "loud":
        w["dt_bias"] = bf16(np.ones(H))
    else:
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), H))
        w["dt_bias"] = bf16(dt + np.log(-np.expm1(-dt)))  # softplus^-1(dt)
    w["D"] = bf16(rng.uniform(0.5, 1.5, H))
    if c.norm != "gate_only":
        w["norm.weight"] = bf16(rng.uniform(0.5, 1.5, I))
    w["out_proj.weight"] = normal((h, I), std)
    if c.proj_bias:
        w["in_proj.bias"] = normal((c.proj_dim,), std)
        w["out_proj.bias"] = normal((h,), std)
    return w


# -------------------------------------------------------------------------------------------- sets

# A set's cases: (name, sequence lengths, with initial states); the names and lengths of the independent sets of
# ../shared/golden, so that a clone without them runs every test on these.
MINI_CASES = [(f"single_T{t}", [t], False) for t in (1, 8, 64, 65, 128, 300)] + [
    ("varlen_balanced_4x32", [32] * 4, False),
    ("varlen_unbalanced_5_17_1_41", [5, 17, 1, 41], False),
    ("single_T128_initstate", [128], True),
    ("varlen_initstate", [5, 17, 1, 41], True),
    ("varlen_initstate_short_1_2_3_70", [1, 2, 3, 70], True),
]
GROUPS_CASES = [("single_T1", [1], False), ("single_T65", [65], False), ("single_T200", [200], False),
                ("varlen_unbalanced_5_17_1_41", [5, 17, 1, 41], False), ("single_T128_initstate", [128], True),
                ("varlen_initstate", [5, 17, 1, 41], True)]
LOUD_CASES = [("loud_T128", [128], False), ("loud_T300", [300], False), ("loud_varlen", [37, 60, 1, 30], False),
              ("loud_varlen_initstate", [5, 17, 1, 41], True)]

# set: (mixer config, make_weights arguments, seed, cases).
SETS = {
    # Nemotron-H, one group, mild gates; mixers at layers 0, 2 and 4.
    "mamba2-mini": (lambda: NemotronH(hidden=256, H=8, P=32, N=32, G=1, eps=1e-5, layers="M-M*M-"),
                    dict(gates="mild"), 20261401, MINI_CASES),
    # Mamba2, two groups of four heads, Mamba2's init gates; every layer a mixer.
    "mamba2-groups": (lambda: Mamba2(hidden=192, H=8, P=48, N=16, G=2, eps=1e-5, layers=2),
                      dict(gates="init"), 20261402, GROUPS_CASES),
    # Granite-4.0-H, N 128, Granite's init gates (decays down to about exp(-100)), z/x/B/C rows 8x larger
    # (the scan output in the thousands, the gated norm's mean square far above eps).
    # Falcon-H1, two groups, every in_proj part scaled (ssm_in_multiplier 0.5 and its parts, each exact in
    # bf16), the norm before the gate; Mamba2's init gates.
    "mamba2-falcon": (lambda: FalconH1(hidden=128, H=8, P=32, N=16, G=2, eps=1e-5, layers=2, in_mult=0.5,
                                       parts=(1.5, 0.75, 2.0, 0.25, 3.0), norm="norm_then_gate"),
                      dict(gates="init"), 20261404, GROUPS_CASES),
    # Zamba2: the first mixer a hybrid layer's (mamba_decoder.mamba.), dt clamped to (time_step_min, inf) with
    # time_step_min 0.02 (dt_bias from dt in [1e-3, 0.1]: the clamp binds for some heads), mild gates.
    "mamba2-zamba": (lambda: Zamba2(hidden=128, H=4, P=64, N=32, G=1, dt_limit=(0.02, math.inf),
                                    layers=["hybrid", "mamba", "mamba"]),
                     dict(gates="mild"), 20261405, GROUPS_CASES),
    "mamba2-loud": (lambda: GraniteMoeHybrid(hidden=256, H=16, P=32, N=128, G=1, eps=1e-5,
                                             layers=["mamba", "mamba", "attention", "mamba"]),
                    dict(gates="loud", proj_scale=8.0), 20261403, LOUD_CASES),
}


def case_tensors(layer: Layer, lens, init: bool, rng: np.random.Generator) -> dict:
    """A case's tensors (float64; written as F32, cu_seqlens I32):
      hidden_states [T, hidden] (bf16-exact), cu_seqlens [S+1];
      initial_recurrent_state [S, H, P, N] (N(0, 0.5), fp32-exact) and initial_conv_state [S, W-1, conv_dim] (the
      bf16 xBC projections of W-1 random tokens before each sequence), only with init;
      out_fp32, out_bf16 [T, hidden]; final_recurrent_state, final_conv_state (fp32 pipeline) and
      final_recurrent_state_bf16, final_conv_state_bf16 [S, H, P, N], [S, W-1, conv_dim];
      z, x_conv [T, H, P], B_conv, C_conv [T, G, N], dt_raw, dt, log_decay [T, H], y_ssm, y_norm [T, H, P]:
      intermediates from the fp32 pipeline."""
    c = layer.cfg
    cu, x, rec0 = case_inputs(rng, lens, c.hidden, (c.H, c.P, c.N), init)
    S = len(lens)
    conv0 = None
    if init:
        earlier = bf16(rng.normal(0.0, 1.0, (S, c.W - 1, c.hidden)))  # the W-1 tokens before each sequence
        conv0 = bf16(earlier @ layer.w["in_proj.weight"][c.inner:c.inner + c.conv_dim].T)
    f = layer.forward(x, cu, rec0, conv0)
    b = layer.forward(x, cu, rec0, conv0, bf16=True)
    t = {"hidden_states": x, "cu_seqlens": cu, "out_fp32": f.out, "out_bf16": b.out,
         "final_recurrent_state": f.recurrent_state, "final_conv_state": f.conv_state,
         "final_recurrent_state_bf16": b.recurrent_state, "final_conv_state_bf16": b.conv_state, **f.inter}
    if init:
        t["initial_recurrent_state"] = rec0
        t["initial_conv_state"] = conv0
    return t


def write_set(set_name: str, outdir: str, quiet: bool = False) -> None:
    make_config, wargs, seed, cases = SETS[set_name]
    c = make_config()
    rng = np.random.default_rng(seed)
    os.makedirs(outdir, exist_ok=True)
    tensors = {}
    for i in c.mixer_layers():
        tensors.update({c.prefix(i) + k: v for k, v in make_weights(c, rng, **wargs).items()})
    write_safetensors(os.path.join(outdir, "model.safetensors"), tensors, bf16_names=set(tensors),
                      meta={"format": "pt"})
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(c.config(), f, indent=2)
        f.write("\n")
    layer = Layer.from_dir(outdir)  # what the set holds, read back
    first = c.mixer_layers()[0]
    for name, lens, init in cases:
        t = case_tensors(layer, lens, init, rng)
        write_case(outdir, set_name, name, t, first, c.model_type, quiet, lambda t=t: summary(t))


def summary(t) -> str:
    """A case's numbers for the progress line: the scan output, the state, the gated norm's mean square, dt A."""
    g = t["y_ssm"] * silu(t["z"])
    return (f"max|y|={np.abs(t['y_ssm']).max():.3g} max|state|={np.abs(t['final_recurrent_state']).max():.3g} "
            f"median mean(g^2)={np.median((g * g).mean(-1)):.3g} "
            f"dt*A in [{t['log_decay'].min():.3g}, {t['log_decay'].max():.3g}]")


def selfcheck(set_name: str) -> None:
    """Split prefill + decode steps against one prefill (float64): the tails and states carry."""
    make_config, wargs, seed, _ = SETS[set_name]
    c = make_config()
    layer = Layer(c, make_weights(c, np.random.default_rng(seed), **wargs))
    x = bf16(np.random.default_rng(seed + 1).normal(0.0, 1.0, (40, c.hidden)))
    whole = layer.forward(x, [0, 40])
    part = layer.forward(x[:30], [0, 30])
    outs, rec, tail = [part.out], part.recurrent_state, part.conv_state
    for i in range(30, 38):  # decode steps
        step = layer.forward(x[i:i + 1], [0, 1], rec, tail)
        outs.append(step.out)
        rec, tail = step.recurrent_state, step.conv_state
    last = layer.forward(x[38:], [0, 2], rec, tail)  # shorter than W-1: the old tail shifted
    outs.append(last.out)

    def rel(a, b):
        return np.abs(a - b).max() / np.abs(b).max()

    err = max(rel(np.concatenate(outs), whole.out), rel(last.recurrent_state, whole.recurrent_state),
              rel(last.conv_state, whole.conv_state))
    print(f"{set_name}: split prefill + decode vs prefill: max relative difference {err:.2e}")
    assert err < 1e-12


if __name__ == "__main__":
    golden_cli(sys.argv[1:], __doc__, SETS, write_set, selfcheck)
