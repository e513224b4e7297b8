"""kda inside Hugging Face transformers (kda.transformers): every transformers family with KDA or Gated
DeltaNet layers, as a tiny random model, kernelized against the same model unkernelized (its torch
fallback): prefill logits at the fp32 tolerance, greedy generation (transformers' cache) giving the same
tokens for a left-padded batch, bf16 by rule v2 against the fp32 run, packed sequences kept apart, and
the kda calls counted."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
kernels = pytest.importorskip("kernels")

import kda.transformers as kt  # noqa: E402
from golden import check_bf16, check_f32, rounded_bf16, shared_tool  # noqa: E402
from hf_families import FAMILIES, linear_layer_modules, tiny_model  # noqa: E402
from torch import nn  # noqa: E402

KDA_FAMILIES = ("kimi_linear", "glm5_next", "bailing_hybrid")
VOCAB_LOW = 3  # token ids drawn from [VOCAB_LOW, vocab): clear of the tiny configs' special ids


@pytest.fixture(scope="module", autouse=True)
def enabled():
    kt.enable()
    yield
    kt.disable()


def kernelized(model):
    return kernels.kernelize(copy.deepcopy(model), device="cpu", mode=kernels.Mode.INFERENCE)


def vocab(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def token_ids(model, batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(VOCAB_LOW, vocab(model), (batch, length), generator=g)


def hooks(family: str) -> tuple[str, str]:
    """The chunked and the recurrent delta-rule hooks a family's layers call."""
    if family in KDA_FAMILIES:
        return "chunk_kda", "fused_recurrent_kda"
    return "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"


def assert_on_kda(counts: dict, *names: str) -> None:
    """Every call went to kda (none to transformers' route) and each named hook ran at least once."""
    on_transformers = {k: v for k, v in counts.items() if v["transformers"]}
    assert not on_transformers, f"calls on transformers' route: {on_transformers}"
    for name in names:
        assert counts.get(name, {}).get("kda", 0) > 0, f"{name} never ran on kda: {counts}"


def logits(model, ids, **kwargs) -> np.ndarray:
    with torch.no_grad():
        return model(ids, **kwargs).logits.to(torch.float32).numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_the_unkernelized_model(family):
    model = tiny_model(family)
    ids = token_ids(model, 2, 70)  # more than one 64-token chunk
    ref = logits(model, ids)
    kern = kernelized(model)
    kt.call_counts(reset=True)
    out = logits(kern, ids)
    assert_on_kda(kt.call_counts(reset=True), hooks(family)[0], "causal_conv1d_fn", "RMSNormGated")
    check_f32(out, ref, what=f"{family} prefill logits")


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_with_left_padding(family):
    model = tiny_model(family)
    ids = token_ids(model, 2, 12, seed=2)
    mask = torch.ones_like(ids)
    pad = model.generation_config.pad_token_id
    ids[0, :3] = pad if pad is not None else 0
    mask[0, :3] = 0
    args = dict(attention_mask=mask, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    with torch.no_grad():
        ref = model.generate(ids, **args)
        kern = kernelized(model)
        kt.call_counts(reset=True)
        out = kern.generate(ids, **args)
    chunk, recurrent = hooks(family)
    assert_on_kda(kt.call_counts(reset=True), chunk, recurrent, "causal_conv1d_fn", "causal_conv1d_update",
                  "RMSNormGated")
    assert out.shape == (2, 12 + 16)
    assert torch.equal(out, ref), f"{family}: kernelized tokens {out[:, 12:]} != {ref[:, 12:]}"


class ReferenceDeltaRule(nn.Module):
    """The chunked delta-rule hooks (both gate widths) in float64 (../shared/tools' recurrences), the
    output rounded once to the value dtype: kda's cast point."""

    def forward(self, query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, **kwargs):
        assert use_qk_l2norm_in_kernel and initial_state is None and not output_final_state
        B, T, HV, V = value.shape
        recurrent = shared_tool("gdn_ref" if g.dim() == 3 else "kda_ref").recurrent
        o = np.empty((B, T, HV, V))
        for b in range(B):
            f64 = [t[b].detach().to(torch.float64).numpy() for t in (query, key, value, g, beta)]
            o[b] = recurrent(*f64, np.zeros((HV, query.shape[-1], V)))[0]
        return torch.from_numpy(o).to(value.dtype), None


class ReferenceConv(nn.Module):
    """causal_conv1d_fn in float64 (SiLU), rounded once to the input dtype: kda's cast point."""

    def forward(self, hidden_states, weight, bias=None, activation=None, **kwargs):
        assert activation in ("silu", "swish")
        x, w = hidden_states.to(torch.float64), weight.to(torch.float64)
        b = None if bias is None else bias.to(torch.float64)
        W = w.shape[1]
        out = torch.nn.functional.conv1d(torch.nn.functional.pad(x, (W - 1, 0)), w[:, None], b, groups=w.shape[0])
        return torch.nn.functional.silu(out).to(hidden_states.dtype)


class ReferenceNorm(nn.Module):
    """RMSNormGated in float64 (the module's weight, eps and activation), rounded once."""

    def forward(self, hidden_states, gate=None):
        o, z = hidden_states.to(torch.float64), gate.to(torch.float64)
        y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight.to(torch.float64)
        y = y * (torch.sigmoid(z) if self.activation == "sigmoid" else torch.nn.functional.silu(z))
        return y.to(hidden_states.dtype)


REFERENCE = {name: {"cpu": {kernels.Mode.INFERENCE: kt._Repository(layer)}} for name, layer in (
    ("chunk_kda", ReferenceDeltaRule), ("chunk_gated_delta_rule", ReferenceDeltaRule),
    ("causal_conv1d_fn", ReferenceConv), ("RMSNormGated", ReferenceNorm))}


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_layer_by_rule_v2(family):
    """A bf16 linear-attention layer kernelized (a) against the same layer with its hooks in float64
    rounded at kda's cast points (r, the reference bf16 pipeline: transformers' projections and gates in
    bf16, then the conv output, the delta-rule output and the norm output rounded once each), and the
    layer in fp32 on the same bf16-exact weights and input (x). Rule v2 of design §5. One layer, not the
    model: a bf16 rounding flip in a MoE router sends a token to another expert."""
    layer = linear_layer_modules(tiny_model(family).to(torch.bfloat16))[0]
    exact = copy.deepcopy(layer).to(torch.float32)
    hidden = layer.o_proj.out_features if hasattr(layer, "o_proj") else layer.out_proj.out_features
    g = torch.Generator().manual_seed(5)
    h = (4 * torch.randn(2, 70, hidden, generator=g)).to(torch.bfloat16)
    with kernels.use_kernel_mapping(REFERENCE, inherit_mapping=False):
        reference = kernels.kernelize(copy.deepcopy(layer), device="cpu", mode=kernels.Mode.INFERENCE)
    kern = kernelized(layer)

    def run(module, inputs):
        with torch.no_grad():
            out = module(inputs)
        return (out[0] if isinstance(out, tuple) else out).to(torch.float32).numpy()

    x = run(exact, h.to(torch.float32))
    r = run(reference, h)
    kt.call_counts(reset=True)
    a = run(kern, h)
    assert_on_kda(kt.call_counts(reset=True), hooks(family)[0], "causal_conv1d_fn", "RMSNormGated")
    assert np.abs(x).max() > 0.05, "outputs too small for the bf16 rule to test anything"
    check_bf16(a, r, x, what=f"{family} bf16 layer")


def packed(model, lengths, seed: int):
    """Sequences of the given lengths, alone ([1, T_i] each) and packed into one row with the boundaries
    a flattening collator passes (position_ids restarting at 0, cu_seq_lens_q/k, max_length_q/k)."""
    seqs = [token_ids(model, 1, n, seed=seed + i) for i, n in enumerate(lengths)]
    cu = torch.tensor(np.cumsum([0, *lengths]), dtype=torch.int32)
    kwargs = dict(position_ids=torch.cat([torch.arange(n) for n in lengths])[None],
                  cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
    return seqs, torch.cat(seqs, dim=1), kwargs


@pytest.mark.parametrize("family", ["kimi_linear", "qwen3_next", "qwen3_5", "olmo_hybrid"])
def test_packed_sequences_are_kept_apart(family):
    model = tiny_model(family)
    lengths = [23, 1, 70, 9]
    seqs, row, kwargs = packed(model, lengths, seed=4)
    ref = np.concatenate([logits(model, s) for s in seqs], axis=1)
    kern = kernelized(model)
    kt.call_counts(reset=True)
    out = logits(kern, row, use_cache=False, **kwargs)
    assert_on_kda(kt.call_counts(reset=True), hooks(family)[0], "causal_conv1d_fn")
    check_f32(out, ref, what=f"{family} packed logits")


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_no_fallback_warning_from_a_model_loaded_after_enable(tmp_path):
    """A model saved and loaded with from_pretrained on the CPU after enable() is kernelized by transformers
    itself: kda runs and transformers does not warn of its torch fallback."""
    tiny_model("qwen3_next").save_pretrained(tmp_path / "gdn")
    tiny_model("kimi_linear").save_pretrained(tmp_path / "kda")
    logging.Logger.warning_once.cache_clear()
    records = Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(records)
    try:
        for name, family in (("gdn", "qwen3_next"), ("kda", "kimi_linear")):
            model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
            ids = token_ids(model, 1, 20)
            kt.call_counts(reset=True)
            with torch.no_grad():
                model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
            assert_on_kda(kt.call_counts(reset=True), *hooks(family), "causal_conv1d_fn", "causal_conv1d_update")
    finally:
        logger.removeHandler(records)
    fallback = [m for m in records.messages if "falling back" in m]
    assert not fallback, fallback


def test_grad_mode_keeps_transformers_route():
    """Parameters that require grad under grad mode (training) go to transformers' own code, unchanged."""
    model = tiny_model("qwen3_next")
    ids = token_ids(model, 1, 20)
    kern = kernelized(model)
    kt.call_counts(reset=True)
    out = kern(ids).logits.detach().numpy()
    counts = kt.call_counts(reset=True)
    assert counts["chunk_gated_delta_rule"] == {"kda": 0, "transformers": 1}
    assert counts["RMSNormGated"]["kda"] == 0
    np.testing.assert_array_equal(out, logits(model, ids))


def test_training_mode_and_disable_leave_transformers_code():
    model = tiny_model("kimi_linear")
    ids = token_ids(model, 1, 20)
    trained = kernels.kernelize(copy.deepcopy(model), device="cpu", mode=kernels.Mode.TRAINING)
    kt.call_counts(reset=True)
    logits(trained, ids)
    assert kt.call_counts(reset=True) == {}
    kt.disable()
    try:
        plain = kernelized(model)
        logits(plain, ids)
        assert kt.call_counts(reset=True) == {}
    finally:
        kt.enable()
    logits(kernelized(model), ids)
    assert_on_kda(kt.call_counts(reset=True), "chunk_kda")


def conv_call(**change):
    """kda._core.short_conv_silu on 2 sequences (6 tokens, 8 channels, width 4), one argument changed."""
    args = dict(y=torch.empty(6, 8), x=torch.randn(6, 8), weight=torch.randn(4, 8), cu_seqlens=torch.tensor([0, 2, 6]),
                tails=torch.empty(2, 3, 8), tail_indices=torch.arange(2, dtype=torch.int32))
    args.update(change)
    return lambda core: core.short_conv_silu(**args)


def norm_call(**change):
    """kda._core.gated_rms_norm on 6 rows of 8, one argument changed."""
    args = dict(y=torch.empty(6, 8), o=torch.randn(6, 8), gate=torch.randn(6, 8), weight=torch.ones(8), eps=1e-6)
    args.update(change)
    return lambda core: core.gated_rms_norm(**args)


def groups_norm_call(**change):
    """kda._core.gated_rms_norm_groups on 6 rows of 2 groups of 4, one argument changed."""
    args = dict(y=torch.empty(6, 8), o=torch.randn(6, 8), z=torch.randn(6, 8), weight=torch.ones(8), eps=1e-6,
                groups=2)
    args.update(change)
    return lambda core: core.gated_rms_norm_groups(**args)


@pytest.mark.parametrize("call, match", [
    (conv_call(y=torch.empty(5, 8)), "y: "),
    (conv_call(weight=torch.randn(4, 5)), "weight: "),
    (conv_call(cu_seqlens=torch.tensor([0, 2, 5])), "cu_seqlens: must run from 0 to T = 6"),
    (conv_call(tail_indices=torch.tensor([1, 1], dtype=torch.int32)), "tail_indices: two sequences share tail 1"),
    (conv_call(x=torch.randn(6, 8, dtype=torch.float16)), "x: dtype must be float32 or bfloat16"),
    (conv_call(bias=torch.randn(5)), "bias: expected shape"),
    (conv_call(bias=torch.randn(8, dtype=torch.float64)), "bias: "),
    (norm_call(gate=torch.randn(6, 4)), "gate: "),
    (norm_call(eps=-1.0), "eps: must be >= 0"),
    (norm_call(activation="gelu"), "activation: must be 'sigmoid' or 'silu', got 'gelu'"),
    (groups_norm_call(z=torch.randn(6, 4)), "z: "),
    (groups_norm_call(weight=torch.ones(4)), "weight: "),
    (groups_norm_call(y=torch.empty(6, 8, dtype=torch.bfloat16)), "y: "),
    (groups_norm_call(groups=3), "groups: must divide the row length C = 8, got 3"),
    (groups_norm_call(groups=0), "groups: must divide the row length C = 8, got 0"),
    (groups_norm_call(eps=-1.0), "eps: must be >= 0"),
])
def test_layer_kernels_name_bad_arguments(call, match):
    """The conv and norm kernels behind the hooks refuse bad arguments by name."""
    from kda import _core

    with pytest.raises((ValueError, TypeError), match=match):
        call(_core)


@pytest.mark.parametrize("kernel", ["optimized", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_short_conv_silu_adds_the_bias_before_the_silu(dtype, kernel):
    """kda._core.short_conv_silu with a bias [C] (Mamba2's conv1d) against float64: silu(taps + bias), on
    sequences with a tail, fresh, shorter than the conv, empty and padding; the tails hold inputs only."""
    from kda import _core

    C, W = 13, 4
    cu = torch.tensor([0, 3, 3, 20, 21, 26])  # 3, 0, 17, 1 and 5 tokens; the last is padding
    idx = torch.tensor([2, 0, 3, 1, -1], dtype=torch.int32)
    has_init = torch.tensor([1, 1, 0, 1, 1], dtype=torch.uint8)
    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(26, C, generator=g)).to(dtype)
    w = torch.rand(W, C, generator=g) * 2 - 1  # [W, C] tap-major
    bias = torch.rand(C, generator=g) * 8 - 4
    bias[0] = -40.0  # channel 0: silu(taps + bias) ~ 0, where silu(taps) + bias would be ~ -40
    tails0 = torch.randn(4, W - 1, C, generator=g).to(dtype)
    tails, y = tails0.clone(), torch.empty(26, C, dtype=dtype)
    _core.short_conv_silu(y, x, w, cu, tails, idx, has_init, bias=bias, kernel=kernel)

    x64, w64, b64, t64 = (t.to(torch.float64).numpy() for t in (x, w, bias, tails0))
    want = np.zeros((26, C))
    want_tails = tails0.to(torch.float32).numpy().copy()
    for n in range(5):
        s, e, i = int(cu[n]), int(cu[n + 1]), int(idx[n])
        if i < 0:
            continue
        rows = np.concatenate([t64[i] if has_init[n] else np.zeros((W - 1, C)), x64[s:e]])
        acc = sum(w64[j] * rows[j:j + e - s] for j in range(W)) + b64
        want[s:e] = acc / (1 + np.exp(-acc))
        want_tails[i] = rows[-(W - 1):]
    got = y.to(torch.float32).numpy()
    if dtype == torch.float32:
        check_f32(got, want, what="y")
    else:
        check_bf16(got, rounded_bf16(want), want, what="y")
    assert np.all(got[:21, 0] < 0) and np.all(got[:21, 0] > -1e-10), got[:21, 0]
    assert np.all(got[21:] == 0)  # padding: zero outputs, the bias not added
    np.testing.assert_array_equal(tails.to(torch.float32).numpy(), want_tails)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_conv1d_fn_takes_the_bias(dtype):
    """transformers' causal_conv1d_fn with a conv bias (Mamba2 mixers) runs on kda: against the conv in
    float64 with its bias and SiLU, rounded once; batch rows and packed sequences (seq_idx) kept apart."""
    C, W = 11, 4
    g = torch.Generator().manual_seed(4)
    w = (torch.rand(C, W, generator=g) * 2 - 1).to(dtype)
    bias = (torch.rand(C, generator=g) * 4 - 2).to(dtype)
    conv = kt.CausalConv1dFn()
    reference = ReferenceConv()
    x = (2 * torch.randn(2, C, 9, generator=g)).to(dtype)
    packed = (2 * torch.randn(1, C, 12, generator=g)).to(dtype)
    seq_idx = torch.tensor([[0] * 5 + [1] * 7], dtype=torch.int32)
    kt.call_counts(reset=True)
    with torch.no_grad():
        got = conv(x, w, bias, activation="silu")
        got_packed = conv(packed, w, bias, activation="silu", seq_idx=seq_idx)
    assert kt.call_counts(reset=True)["causal_conv1d_fn"] == {"kda": 2, "transformers": 0}

    def exact(h):  # the hook in float64, not rounded
        return reference(h.to(torch.float64), w, bias, activation="silu").numpy()

    want = exact(x)
    want_packed = np.concatenate([exact(packed[..., :5]), exact(packed[..., 5:])], axis=-1)
    for a, r, what in ((got, want, "rows"), (got_packed, want_packed, "packed")):
        assert a.dtype == dtype and a.shape == r.shape
        a = a.to(torch.float32).numpy()
        if dtype == torch.float32:
            check_f32(a, r, what=what)
        else:
            check_bf16(a, rounded_bf16(r), r, what=what)


@pytest.mark.parametrize("groups, width", [(1, 100), (2, 24), (8, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", ["optimized", "reference"])
def test_gated_rms_norm_groups_matches_the_formula(groups, width, dtype, kernel):
    """kda._core.gated_rms_norm_groups (Mamba2's norm) against the formula in float64, and in fp32 against
    transformers' Mamba2RMSNormGated (the gate before the norm, the mean per group). In bf16 transformers
    rounds before the weight; kda rounds once, so bf16 is checked against the formula only."""
    from kda import _core

    g = torch.Generator().manual_seed(groups * 1000 + width)
    C = groups * width
    o = (torch.rand(7, C, generator=g) * 6 - 3).to(dtype)
    z = (torch.rand(7, C, generator=g) * 16 - 8).to(dtype)
    weight = torch.rand(C, generator=g) + 0.5
    eps = 1e-5
    y = torch.empty(7, C, dtype=dtype)
    _core.gated_rms_norm_groups(y, o, z, weight, eps, groups=groups, kernel=kernel)
    o64, z64 = o.double().numpy(), z.double().numpy()
    gated = (o64 * z64 / (1 + np.exp(-z64))).reshape(7, groups, width)
    want = (gated / np.sqrt((gated**2).mean(-1, keepdims=True) + eps)).reshape(7, C) * weight.double().numpy()
    got = y.float().numpy()
    assert np.abs(got).max() > 0.1
    if dtype == torch.float32:
        check_f32(got, want, what="vs float64")
        from transformers.models.mamba2.modeling_mamba2 import Mamba2RMSNormGated

        norm = Mamba2RMSNormGated(C, width, eps=eps)
        with torch.no_grad():
            norm.weight.copy_(weight)
            check_f32(got, norm(o, gate=z).numpy(), what="vs transformers")
    else:
        check_bf16(got, rounded_bf16(want), want, what="vs float64")
