"""The first delta-rule module of a tiny transformers model (hf_families.py) as a kda checkpoint, and the
module itself as kda's reference (5.25.0, its torch route, fp32); the same for the Mamba2 mixers of a tiny
Mamba2 model type (:class:`TinyMixers`, test_mamba2_families.py), saved by transformers itself.

A test helper, no tests (test_family_layers.py). :class:`TinyLayer` redraws the
module's weights so projections, gates and the norm are non-trivial, converts its state_dict to the
tensor names of the family's original checkpoints (what safetensors holds: transformers renames them at
load, ``conversion_mapping.py``, and back when saving) under the model's layer-0 prefix, and writes them
with config.json (the model's config, nested as transformers writes it). The module then runs one
sequence, with or without transformers' cache, and its cached states are read as kda keeps them.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers

from golden import write_safetensors
from hf_families import linear_layer_modules, mixer_modules, tiny_model


def _split_conv(t: dict, sizes) -> dict:
    """transformers' one depthwise conv over q|k|v -> the checkpoints' q_conv1d, k_conv1d, v_conv1d."""
    w = t.pop("conv1d.weight")
    parts = np.split(w, np.cumsum(sizes)[:-1], axis=0)
    return t | {f"{n}_conv1d.weight": p for n, p in zip("qkv", parts)}


def _unnest_forget_gate(t: dict) -> dict:
    """Kimi-style forget gate: transformers' ``forget_gate.*`` -> the checkpoints' flat names."""
    return {k.removeprefix("forget_gate."): v for k, v in t.items()}


def _kimi_names(t: dict, m) -> dict:  # GLM-5 Next: exactly Kimi-Linear's tensors
    return _split_conv(_unnest_forget_gate(t), [m.qkv_dim] * 3)


def _bailing_names(t: dict, m) -> dict:  # + the output projection named dense (its attention prefix: see _PREFIXES)
    t = _kimi_names(t, m)
    t["dense.weight"] = t.pop("o_proj.weight")
    return t


def _olmo_names(t: dict, m) -> dict:
    return _split_conv(t, [m.key_dim, m.key_dim, m.value_dim])


def _lara_names(t: dict, m) -> dict:
    """One fused in_proj, rows q|k|v|z|b|a (flat), and the gated norm named out_norm."""
    fused = [t.pop(f"in_proj_{n}.weight") for n in ("qkv", "z", "b", "a")]
    t["in_proj.weight"] = np.concatenate(fused)
    t["out_norm.weight"] = t.pop("norm.weight")
    return t


# family: (layer 0's prefix in its checkpoints, state_dict -> checkpoint names)
_CHECKPOINT = {
    "kimi_linear": ("model.layers.0.self_attn.", _kimi_names),
    "glm5_next": ("model.language_model.layers.0.self_attn.", _kimi_names),  # the multimodal model's text layers
    "bailing_hybrid": ("model.layers.0.attention.", _bailing_names),
    "olmo_hybrid": ("model.layers.0.linear_attn.", _olmo_names),
    "lara_mini": ("model.layers.0.linear_attn.", _lara_names),
    "qwen4_exp": ("model.layers.0.linear_attn.", lambda t, m: t),
    "qwen3_next": ("model.layers.0.linear_attn.", lambda t, m: t),
    "qwen3_5": ("model.layers.0.linear_attn.", lambda t, m: t),
    "qwen3_5_moe": ("model.layers.0.linear_attn.", lambda t, m: t),
}

# The gates' draws (see TinyLayer._redraw): KDA with the lower bound L = -5 (g = L sigmoid(exp(A_log) (f + dt_bias)))
# over a spread of dt_bias reaches both ends; GDN's softplus gate, exp(A_log) in [0.05, 1], dt_bias around 0.
_KDA_FAMILIES = ("glm5_next", "bailing_hybrid")


class _Tiny:
    """What the tiny models share: random input rows [n, hidden] and a fresh transformers cache."""

    def inputs(self, n: int, seed: int = 1) -> np.ndarray:
        return np.random.default_rng(seed).standard_normal((n, self.hidden)).astype(np.float32)

    def new_cache(self):
        return transformers.DynamicCache(config=self.config)


class TinyLayer(_Tiny):
    """A family's first delta-rule module (transformers), its weights redrawn, and its checkpoint directory
    ``root / family``: ``tensors`` (checkpoint name -> float32 array), ``prefix`` (layer 0's), the shapes
    H, HV, K, V, W, C (= 2 H K + HV V)."""

    def __init__(self, family: str, root, seed: int = 7):
        self.family = family
        self.model = tiny_model(family)
        self.config = self.model.config
        self.module = linear_layer_modules(self.model)[0]
        m = self.module
        assert m.layer_idx == 0
        self._redraw(seed)
        self.hidden = self.config.get_text_config().hidden_size
        if hasattr(m, "num_k_heads"):  # Gated DeltaNet
            self.H, self.HV, self.K, self.V = m.num_k_heads, m.num_v_heads, m.head_k_dim, m.head_v_dim
        else:  # KDA
            self.H = self.HV = m.num_heads
            self.K = self.V = m.head_dim
        self.W = m.conv_kernel_size
        self.C = 2 * self.H * self.K + self.HV * self.V
        self.prefix, to_checkpoint = _CHECKPOINT[family]
        state = {k: v.detach().numpy().astype(np.float32) for k, v in m.state_dict().items()}
        self.tensors = {self.prefix + k: v for k, v in to_checkpoint(state, m).items()}
        self.path = root / family
        self.path.mkdir()
        self.write(self.path, self.config.to_json_string(use_diff=False), self.tensors)

    @staticmethod
    def write(path, config_json: str, tensors: dict) -> None:
        (path / "config.json").write_text(config_json)
        write_safetensors(path / "model.safetensors", tensors)

    def _redraw(self, seed: int) -> None:
        """Projections of unit gain (outputs of order 1, not transformers' 0.02 init; OLMo's b_proj of gain
        2: beta = 2 sigmoid(b) over most of (0, 2)), a depthwise conv of order 1, a norm weight around 1
        (not all ones). Gates: GDN exp(A_log) in [0.05, 1] with dt_bias around 0 (g mostly in
        [-3, -0.01]: the state carries over many tokens); KDA's lower-bound gate exp(A_log) in [0.5, 2]
        with dt_bias spread over [-6, 3] (g from near 0, a state kept over many tokens, down to the
        bound, -5: a state forgotten at once)."""
        g = torch.Generator().manual_seed(seed)
        kda_gate = self.family in _KDA_FAMILIES
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if name.endswith("proj.weight") or "proj_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
                    if self.family == "olmo_hybrid" and name == "b_proj.weight":
                        p.mul_(2.0)  # beta = 2 sigmoid(b) over most of (0, 2)
                elif name.endswith("conv1d.weight"):
                    p.copy_(0.5 * torch.randn(p.shape, generator=g))
                elif name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
                elif leaf == "A_log":
                    lo = 0.5 if kda_gate else 0.05
                    p.copy_(torch.empty(p.shape).uniform_(lo, 2.0 if kda_gate else 1.0, generator=g).log())
                elif leaf == "dt_bias":
                    p.copy_(torch.empty(p.shape).uniform_(-6.0, 3.0, generator=g) if kda_gate
                            else 0.5 * torch.randn(p.shape, generator=g))
                else:
                    raise AssertionError(f"{self.family}: no draw for parameter {name}")

    def hf(self, x: np.ndarray, cache=None) -> np.ndarray:
        """The module over one sequence x [t, hidden] (through ``cache`` when given): out [t, hidden]."""
        with torch.no_grad():
            return self.module(torch.from_numpy(x)[None], cache=cache)[0].numpy()

    def hf_states(self, cache) -> tuple[np.ndarray, np.ndarray]:
        """transformers' cached states of layer 0 as kda keeps them: recurrent [1, HV, K, V] and the conv
        tail [1, W-1, C] (the cache's [1, C, W] without its first column, transposed)."""
        rec = cache.get_recurrent_state(0).detach().numpy().copy()  # copies: the cache updates them in place
        conv = cache.get_conv_state(0).detach().numpy().copy()
        assert rec.shape == (1, self.HV, self.K, self.V) and conv.shape == (1, self.C, self.W)
        return rec, conv[:, :, 1:].transpose(0, 2, 1)

    def hf_prefill_then_decode(self, x: np.ndarray, prefill: int):
        """transformers through its cache: prefill x[:prefill], then one token at a time. (outputs
        [len(x), hidden], [(recurrent, conv)] after the prefill and after each decode step)."""
        cache = self.new_cache()
        outs = [self.hf(x[:prefill], cache)]
        states = [self.hf_states(cache)]
        for t in range(prefill, len(x)):
            outs.append(self.hf(x[t:t + 1], cache))
            states.append(self.hf_states(cache))
        return np.concatenate(outs), states

    def qkv_weight(self) -> np.ndarray:
        """[C, hidden]: the rows of the raw q|k|v projections the conv reads, head-major (Qwen3-Next's
        in_proj_qkvz interleaves q, k, v, z per key-head group)."""
        m = self.module
        if hasattr(m, "in_proj_qkv"):
            return m.in_proj_qkv.weight.detach().numpy()
        if hasattr(m, "q_proj"):
            return torch.cat([m.q_proj.weight, m.k_proj.weight, m.v_proj.weight]).detach().numpy()
        r = self.HV // self.H
        w = m.in_proj_qkvz.weight.detach().numpy().reshape(self.H, 2 * self.K + 2 * r * self.V, self.hidden)
        q, k, v = w[:, :self.K], w[:, self.K:2 * self.K], w[:, 2 * self.K:2 * self.K + r * self.V]
        return np.concatenate([a.reshape(-1, self.hidden) for a in (q, k, v)])


class TinyMixers(_Tiny):
    """A tiny model of a Mamba2 model type (hf_families.MAMBA2_FAMILIES, ``overrides`` on its config), every
    mixer's weights redrawn, written by transformers' own ``save_pretrained`` to ``root / (name or family)``
    (config.json and safetensors as transformers writes them: kda reads that directory), and its mixers
    (``mixers``, at model layers ``layers``) as kda's reference. The first mixer's shapes: H heads of P dims,
    state size N, G groups, conv width W over C = H P + 2 G N channels x|B|C, the gated norm's eps."""

    def __init__(self, family: str, root, seed: int = 7, name: str | None = None, **overrides):
        self.family = family
        self.model = tiny_model(family, **overrides)
        self.config = self.model.config
        self.mixers = mixer_modules(self.model)
        self.layers = [m.layer_idx for m in self.mixers]
        self._redraw(seed)
        m = self.mixers[0]
        self.hidden = self.config.hidden_size
        self.H, self.P, self.N, self.G = m.num_heads, m.head_dim, m.ssm_state_size, m.n_groups
        # Falcon-H1 without mamba_rms_norm: no norm (its config's rms_norm_eps stands for the eps kda reports)
        eps = getattr(m.norm, "variance_epsilon", self.config.rms_norm_eps if self.family == "falcon_h1" else None)
        self.W, self.C, self.eps = m.conv_kernel_size, m.conv_dim, eps
        assert self.C == self.H * self.P + 2 * self.G * self.N
        self.path = root / (name or family)
        self.model.save_pretrained(self.path)

    def _redraw(self, seed: int) -> None:
        """Projections of unit gain (outputs of order 1; dt_raw too, so dt = softplus(dt_raw + dt_bias) spreads
        over about (0.05, 3)), a conv and its bias of order 1, a norm weight around 1, D in [0.5, 1.5],
        exp(A_log) in [0.05, 2] (a state kept over tens of tokens down to one forgotten within a few)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for m in self.mixers:
                for name, p in m.named_parameters():
                    if name.endswith("proj.weight"):
                        p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
                    elif name == "conv1d.weight":
                        p.copy_(0.5 * torch.randn(p.shape, generator=g))
                    elif name == "conv1d.bias":
                        p.copy_(0.3 * torch.randn(p.shape, generator=g))
                    elif name == "norm.weight":
                        p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
                    elif name == "A_log":
                        p.copy_(torch.empty(p.shape).uniform_(0.05, 2.0, generator=g).log())
                    elif name == "dt_bias":
                        p.copy_(0.5 * torch.randn(p.shape, generator=g))
                    elif name == "D":
                        p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=g))
                    else:
                        raise AssertionError(f"{self.family}: no draw for parameter {name}")

    def hf(self, x: np.ndarray, cache=None, mixer: int = 0) -> np.ndarray:
        """Mixer ``mixer`` over one sequence x [t, hidden] (through ``cache`` when given): out [t, hidden]."""
        with torch.no_grad():
            return self.mixers[mixer](torch.from_numpy(x)[None], cache=cache)[0].numpy()

    def hf_states(self, cache, mixer: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """transformers' cached states of mixer ``mixer`` as kda keeps them: recurrent [1, H, P, N] (the same
        layout) and the conv tail [1, W-1, C] (the cache's [1, C, W] without its first column, transposed)."""
        layer = self.layers[mixer]
        rec = cache.get_recurrent_state(layer).detach().numpy().copy()  # copies: the cache updates them in place
        conv = cache.get_conv_state(layer).detach().numpy().copy()
        assert rec.shape == (1, self.H, self.P, self.N) and conv.shape == (1, self.C, self.W)
        return rec, conv[:, :, 1:].transpose(0, 2, 1)

    def hf_prefill_then_decode(self, x: np.ndarray, prefill: int, mixer: int = 0):
        """Mixer ``mixer`` through transformers' cache: prefill x[:prefill], then one token at a time (outputs
        [len(x), hidden], [(recurrent, conv)] after the prefill and after each decode step)."""
        cache = self.new_cache()
        outs = [self.hf(x[:prefill], cache, mixer)]
        states = [self.hf_states(cache, mixer)]
        for t in range(prefill, len(x)):
            outs.append(self.hf(x[t:t + 1], cache, mixer))
            states.append(self.hf_states(cache, mixer))
        return np.concatenate(outs), states

    def conv_input_weight(self, mixer: int = 0) -> np.ndarray:
        """[C, hidden]: the in_proj rows x|B|C the conv reads (in_proj's rows are z|x|B|C|dt)."""
        m = self.mixers[mixer]
        inner = m.num_heads * m.head_dim
        return m.in_proj.weight.detach().numpy()[inner:inner + m.conv_dim]

    def dt(self, x: np.ndarray, mixer: int = 0) -> np.ndarray:
        """softplus(dt_raw + dt_bias) [t, H] of mixer ``mixer`` on x [t, hidden], before time_step_limit."""
        m = self.mixers[mixer]
        with torch.no_grad():
            raw = m.in_proj(torch.from_numpy(x))[:, -m.num_heads:]
            return torch.nn.functional.softplus(raw + m.dt_bias).numpy()


def check_layer_decode(tiny, L, T: int, decode: int) -> None:
    """A layer `L` (kda's, called as L(x, cu_seqlens, recurrent, conv)) over tiny's T-token prefill then `decode`
    single-token steps with its states carried, against transformers' module through its cache
    (tiny.hf_prefill_then_decode): every output and the states after every token, to the fp32 rule; decoding
    from zero states must differ (the states carry information)."""
    from golden import check_f32, check_state_f32

    x = tiny.inputs(T + decode, seed=2)
    want, want_states = tiny.hf_prefill_then_decode(x, T)
    out, rec, conv = L(x[:T])
    check_f32(out, want[:T], what="prefill out")
    for i, t in enumerate(range(T, T + decode + 1)):
        check_state_f32(rec, want_states[i][0], what=f"recurrent state after {t} tokens")
        check_state_f32(conv, want_states[i][1], what=f"conv state after {t} tokens")
        if t == T + decode:
            break
        out, rec, conv = L(x[t:t + 1], None, rec, conv)
        assert out.shape == (1, tiny.hidden)
        check_f32(out, want[t:t + 1], what=f"decode step {t - T}")
    assert np.abs(L(x[T:T + 1])[0] - want[T:T + 1]).max() > 1e-3


def check_layer_prefill(tiny, L, length: int, state_shape: tuple) -> np.ndarray:
    """A layer `L` over one sequence of `length` tokens against transformers' module (outputs of order 1, so that
    the fp32 rule tests something), and its final states (`state_shape`, one sequence) against transformers'
    cache after the same prefill; returns transformers' recurrent state."""
    from golden import check_f32, check_state_f32

    x = tiny.inputs(length)
    want = tiny.hf(x)
    assert np.abs(want).max() > 0.1
    out, rec, conv = L(x)
    assert out.dtype == np.float32 and rec.shape == state_shape and conv.shape == (1, 3, tiny.C)
    check_f32(out, want, what=f"{tiny.family} out")
    cache = tiny.new_cache()
    check_f32(tiny.hf(x, cache), want, what="transformers with and without its cache")
    want_rec, want_conv = tiny.hf_states(cache)
    check_state_f32(rec, want_rec, what="recurrent state")
    check_state_f32(conv, want_conv, what="conv state")
    return want_rec
