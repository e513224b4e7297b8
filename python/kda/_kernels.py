"""The delta-rule kernels with fla's signatures over numpy, torch CPU and JAX CPU arrays.

The entries are fla-core 0.6.0's, with fla's names, argument order and defaults: for KDA
``chunk_kda``, ``fused_recurrent_kda``, the pool and speculative-decoding entry
``fused_recurrent_kda_fwd`` (vLLM's) and ``fused_kda_gate``; for Gated DeltaNet (GDN, a scalar gate
per value head) ``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``, vLLM's
``fused_recurrent_gated_delta_rule_fwd`` and ``fused_gdn_gate``. docs/fla-api.md lists every option
and where kda differs. Every check of the arguments is the C++ call description's
(kda/kernels/kda_args.h), reached through ``_core.chunk_kda`` / ``_core.fused_recurrent_kda`` (GDN
with ``entry="gated_delta_rule"``, which names its entries in the errors), whose messages surface
unchanged. What stays here is Python's: the keywords fla passes through ``**kwargs`` (each one
accepted, honoured or refused by name), converting arrays for the core (bf16 bit views, index
lists, small float parameters), and allocating the outputs in the caller's framework. A call first
asks the core for the sizes it implies (``check_only``), allocates, then runs.

kda is forward-only. As in fla, the recurrent entries have no backward: they run on torch tensors
that require grad and return results without a graph; the chunk entries and the gates, which fla
differentiates, refuse such tensors under grad mode.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import _core
from ._arrays import (
    empty_like_framework,
    for_core,
    for_core_writable,
    int_array,
    is_torch,
    np_dtype,
    param_f32,
    spec_of,
)

# Keywords fla's entries take that only steer how its GPU kernels are launched or recomputed: accepted
# (kda has one way to run them) and otherwise ignored. chunk_kda names them in its signature; fla's
# recurrent entries take them through **kwargs (and drop them), so kda's accept them there too.
# cu_seqlens_cpu is more than a hint in chunk_kda: see host_cu_seqlens.
_HINTS = ("disable_recompute", "cu_seqlens_cpu", "use_graph", "max_num_seqs")
# The same for GDN: the hints fla's chunk_gated_delta_rule names, accepted by the recurrent GDN entries.
_GDN_HINTS = ("cu_seqlens_cpu", "chunk_indices")

# The entries' names in kda's messages, by the core's ``entry``.
CHUNK_NAMES = {"kda": "chunk_kda", "gated_delta_rule": "chunk_gated_delta_rule"}
RECURRENT_NAMES = {"kda": "fused_recurrent_kda", "gated_delta_rule": "fused_recurrent_gated_delta_rule"}


def _state_v_first(state_v_first: bool, kwargs: dict) -> bool:
    """fla's deprecated ``transpose_state_layout`` (popped from kwargs), with fla's warning."""
    if "transpose_state_layout" not in kwargs:
        return bool(state_v_first)
    if state_v_first:
        raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning,
                  stacklevel=3)
    return bool(kwargs.pop("transpose_state_layout"))


def _refuse_unknown(who: str, kwargs: dict, known) -> None:
    """Any keyword kda does not implement is a TypeError naming it (never silently dropped)."""
    for name in kwargs:
        if name not in known:
            raise TypeError(f"{who}() got an unexpected keyword argument '{name}' (kda does not implement it; "
                            f"see docs/fla-api.md)")


def host_cu_seqlens(who: str, cu_seqlens_cpu, cu_seqlens, known: bool = True) -> list[int] | None:
    """fla's ``cu_seqlens_cpu`` (cu_seqlens' values on the host) as a list of ints; None when it is not
    given or there is no ``cu_seqlens`` (fla reads it only with cu_seqlens). With ``known`` (cu_seqlens'
    values at hand, not traced) it must hold the same values: a ValueError naming it otherwise, since
    the front ends that size h from it (kda.torch under torch.compile, kda.jax under jit) would
    otherwise return a wrongly sized result."""
    if cu_seqlens_cpu is None or cu_seqlens is None:
        return None
    host = int_array(cu_seqlens_cpu, "cu_seqlens_cpu", np.int64)
    if host.ndim != 1:
        raise ValueError(f"{who}: cu_seqlens_cpu: expected shape [N + 1], got {list(host.shape)}")
    host = [int(x) for x in host]
    if known:
        dev = [int(x) for x in int_array(cu_seqlens, "cu_seqlens", np.int64).reshape(-1)]
        if len(host) != len(dev):
            raise ValueError(f"{who}: cu_seqlens_cpu: expected cu_seqlens' {len(dev)} values, got {len(host)}")
        for i, (a, b) in enumerate(zip(host, dev)):
            if a != b:
                raise ValueError(f"{who}: cu_seqlens_cpu: must hold cu_seqlens' values: cu_seqlens_cpu[{i}] = {a}, "
                                 f"cu_seqlens[{i}] = {b}")
    return host


def chunk_count(cu: list, chunk_size: int):
    """NT of the intermediate states for packed sequences: the sum of ceil(length / chunk_size)."""
    return sum((b - a + chunk_size - 1) // chunk_size for a, b in zip(cu[:-1], cu[1:]))


def _check_grad(who: str, **tensors) -> None:
    """The chunk entries and the gates (which fla differentiates) have no backward pass in kda: a torch
    tensor that requires grad under grad mode is refused."""
    if not any(x is not None and is_torch(x) for x in tensors.values()):
        return
    import torch

    if not torch.is_grad_enabled():
        return
    for name, x in tensors.items():
        if x is not None and is_torch(x) and x.requires_grad:
            raise RuntimeError(f"{who}: {name} requires grad, but kda is forward-only (no backward pass); "
                               f"call it under torch.no_grad() or torch.inference_mode()")


_CHUNK_KEYWORDS = ("A_log", "dt_bias", "chunk_size", "state_indices", "kernel")
# chunk_gated_delta_rule's keywords beyond its signature (fla's through **kwargs; kda's pool form and kernel).
_GDN_CHUNK_KEYWORDS = ("use_gate_in_kernel", *_CHUNK_KEYWORDS)


def _chunk_keywords(state_v_first, cp_context, return_intermediate_states, disable_recompute, kwargs, *,
                    who: str = "chunk_kda", known=_CHUNK_KEYWORDS, **tensors) -> bool:
    """A chunk entry's keyword handling (chunk_kda's by default), shared by the front ends; returns
    state_v_first. ``tensors``: the torch tensors to refuse when they require grad."""
    state_v_first = _state_v_first(state_v_first, kwargs)
    _refuse_unknown(who, kwargs, known)
    if cp_context is not None:
        raise NotImplementedError(f"{who}: cp_context (context parallelism) is not supported by kda")
    if return_intermediate_states and disable_recompute:
        # fla's rule (an assertion there): h is kept only on the recomputing path.
        raise ValueError(f"{who}: return_intermediate_states must be used with disable_recompute=False")
    _check_grad(who, A_log=kwargs.get("A_log"), dt_bias=kwargs.get("dt_bias"), **tensors)
    return state_v_first


def _gdn_chunk_keywords(state_v_first, cp_context, kwargs, **tensors) -> bool:
    """chunk_gated_delta_rule's keyword handling (fla's head_first refusal, then chunk_kda's rules with
    its own keywords); returns state_v_first."""
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")  # fla's
    return _chunk_keywords(state_v_first, cp_context, False, False, kwargs, who="chunk_gated_delta_rule",
                           known=_GDN_CHUNK_KEYWORDS, **tensors)


def _fwd_keywords(state_v_first, kwargs, who: str = "fused_recurrent_kda_fwd", hints=_HINTS) -> bool:
    """A vLLM pool entry's keyword handling (fused_recurrent_kda_fwd's by default; numpy and torch
    entries); returns state_v_first. Tensors that require grad are read (no backward, as fla)."""
    state_v_first = _state_v_first(state_v_first, kwargs)
    _refuse_unknown(who, kwargs, ("kernel", *hints))
    return state_v_first


# The pool and speculative-decoding keywords of the vLLM entries (fused_recurrent_kda_fwd,
# fused_recurrent_gated_delta_rule_fwd), which fla's public recurrent entries drop into **kwargs: kda
# honours them there with the _fwd entry's meaning.
_POOL_KEYWORDS = ("ssm_state_indices", "num_accepted_tokens", "inplace_final_state", "out")


def _public_keywords(who: str, state_v_first, kwargs: dict, hints) -> bool:
    """A public recurrent entry's keywords: the _fwd entry's pool keywords honoured, contiguous states
    (inplace_final_state=False) unless one of them is given; returns state_v_first."""
    state_v_first = _state_v_first(state_v_first, kwargs)
    _refuse_unknown(who, kwargs, (*_POOL_KEYWORDS, "kernel", *hints))
    if not any(name in kwargs for name in _POOL_KEYWORDS):
        kwargs["inplace_final_state"] = False
    return state_v_first


def public_recurrent(fwd, q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
                     use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                     lower_bound, state_v_first, cu_seqlens, kwargs):
    """fla's public fused_recurrent_kda as a call of a front end's ``fwd`` entry: contiguous states
    (inplace_final_state=False) unless the pool keywords, honoured with _fwd's meaning, are given."""
    state_v_first = _public_keywords("fused_recurrent_kda", state_v_first, kwargs, _HINTS)
    return fwd(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state, scale=scale,
               output_final_state=output_final_state, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
               use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
               use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
               lower_bound=lower_bound, **kwargs)


class GateOps:
    """What public_gdn_recurrent computes in a front end's arrays: ``full(shape, value)`` a float32
    array, ``f32(x)`` x as float32, ``gate(g, A_log, dt_bias)`` the GDN gate (float32), all usable with
    ``+`` and ``[..., None]``."""

    def __init__(self, full, f32, gate):
        self.full, self.f32, self.gate = full, f32, gate


def _tokens_shape(q, v) -> tuple:
    """(B, T, HV) of a call, 0 where q or v lacks the dimension (the core then refuses them by name)."""
    qs, vs = tuple(getattr(q, "shape", ())), tuple(getattr(v, "shape", ()))
    return (qs[0] if len(qs) > 0 else 0, qs[1] if len(qs) > 1 else 0, vs[2] if len(vs) > 2 else 0)


def public_gdn_recurrent(fwd, ops: GateOps, q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state,
                         use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                         allow_neg_eigval, state_v_first, cu_seqlens, kwargs):
    """fla's public fused_recurrent_gated_delta_rule as a call of a front end's GDN ``fwd`` entry, the
    pool keywords honoured as in :func:`public_recurrent`. Its decays: ``g`` [B, T, HV] (a scalar per
    value head; the raw gate with use_gate_in_kernel), ``gk`` [B, T, HV, K] (per key dimension: the
    KDA recurrence), both (fla multiplies the decays: gk + g, g activated first with
    use_gate_in_kernel, as fla's kernel applies the gate to g only), none (no decay); ``gv`` refused.
    beta None: ones [B, T, HV]."""
    who = "fused_recurrent_gated_delta_rule"
    state_v_first = _public_keywords(who, state_v_first, kwargs, _GDN_HINTS)
    if gv is not None:
        raise NotImplementedError(f"{who}: gv (a decay per value dimension) is not supported by kda")
    if use_gate_in_kernel:  # fla's checks and messages
        if A_log is None:
            raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`.")
        if g is None:
            raise ValueError("`g` (raw pre-activation) must be provided when `use_gate_in_kernel=True`.")
    B, T, HV = _tokens_shape(q, v)
    if gk is not None:
        K = (tuple(getattr(q, "shape", ())) or (0,))[-1]
        if tuple(gk.shape) != (B, T, HV, K):
            raise ValueError(f"{who}: gk: expected shape [B, T, HV, K] = {[B, T, HV, K]}, got {list(gk.shape)}")
        if g is not None:
            if tuple(g.shape) != (B, T, HV):
                raise ValueError(f"{who}: g: expected shape [B, T, HV] = {[B, T, HV]}, got {list(g.shape)}")
            g = ops.gate(g, A_log, dt_bias) if use_gate_in_kernel else ops.f32(g)
            gk = ops.f32(gk) + g[..., None]
            use_gate_in_kernel = False
        g = gk
    elif g is None:
        g = ops.full((B, T, HV), 0.0)
    if beta is None:
        beta = ops.full((B, T, HV), 1.0)
    return fwd(q, k, v, g, beta, scale, initial_state, A_log=A_log, dt_bias=dt_bias,
               output_final_state=output_final_state, state_v_first=state_v_first, cu_seqlens=cu_seqlens,
               use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
               use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval, **kwargs)


def refuse_tree(retrieve_parent_token) -> None:
    """vLLM's tree speculative decoding (EAGLE trees) is not implemented."""
    if retrieve_parent_token is not None:
        raise NotImplementedError("fused_recurrent_gated_delta_rule_fwd: retrieve_parent_token (tree speculative "
                                  "decoding) is not supported by kda")


def _tokens(x, name: str):
    """q, k or v for the core: read in place when C-contiguous or token-strided (the columns of a fused
    projection: strides [T * s, s, dim, 1]); a numpy array or torch tensor of any other layout (a transposed
    view, say) is copied once, C-contiguous. Other arrays go as they are (the core names a layout it refuses)."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous and not _core.reads_in_place(for_core(x, name)):
            x = np.ascontiguousarray(x)
    elif is_torch(x):
        if not x.is_contiguous() and not _core.reads_in_place(for_core(x, name)):
            x = x.contiguous()
    return for_core(x, name)


def _common(q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
            use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, A_log, dt_bias,
            kernel) -> dict:
    """The arguments both kernels share, converted for the core. g and beta are read as they are
    (C-contiguous; the core refuses other layouts, naming them)."""
    args = {n: _tokens(x, n) for n, x in (("q", q), ("k", k), ("v", v))}
    args.update((n, for_core(x, n)) for n, x in (("g", g), ("beta", beta)))
    gate = bool(use_gate_in_kernel)
    args.update(
        scale=None if scale is None else float(scale),
        cu_seqlens=None if cu_seqlens is None else int_array(cu_seqlens, "cu_seqlens", np.int64),
        use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), use_gate_in_kernel=gate,
        use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel), allow_neg_eigval=bool(allow_neg_eigval),
        lower_bound=None if lower_bound is None else float(lower_bound), state_v_first=bool(state_v_first),
        # As fla: A_log and dt_bias only matter with the gate in the kernel.
        A_log=param_f32(A_log, "A_log") if gate and A_log is not None else None,
        dt_bias=param_f32(dt_bias, "dt_bias") if gate and dt_bias is not None else None,
        kernel=kernel)
    return args


def _output(q, s: dict, like=None):
    """o [B, T, HV, V] in q's framework and fla's dtype (checked by the core): ``like``'s (v for the recurrent
    entries), else q's."""
    return empty_like_framework(q, (s["B"], s["T"], s["HV"], s["V"]), np_dtype(q if like is None else like))


def _states(q, rows: int, s: dict, state_v_first: bool, zero: bool = False):
    """A new float32 state buffer [rows, HV, K, V] ([rows, HV, V, K] V-first) in q's framework."""
    inner = (s["V"], s["K"]) if state_v_first else (s["K"], s["V"])
    return empty_like_framework(q, (rows, s["HV"], *inner), np.dtype(np.float32), zero=zero)


def _run_chunk(entry: str, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
               use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
               state_v_first, cu_seqlens, return_intermediate_states, kwargs):
    """The chunked kernel through the core (keywords handled): ``(o, final_state)``, h third with
    ``return_intermediate_states``."""
    state_indices = kwargs.get("state_indices")
    args = _common(q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, kwargs.get("A_log"),
                   kwargs.get("dt_bias"), kwargs.get("kernel", "auto"))
    inter = bool(return_intermediate_states)
    args.update(safe_gate=bool(safe_gate), chunk_size=int(kwargs.get("chunk_size", 64)),
                return_intermediate_states=inter, entry=entry)
    pool = state_indices is not None
    if pool:
        args.update(initial_state=None, output_final_state=True,
                    state=None if initial_state is None else for_core_writable(initial_state, "initial_state"),
                    state_indices=int_array(state_indices, "state_indices", np.int32))
    else:
        args.update(initial_state=None if initial_state is None else for_core(initial_state, "initial_state"),
                    output_final_state=bool(output_final_state), state=None, state_indices=None)
    s = _core.chunk_kda(o=None, final_state=None, check_only=True, **args)
    o = _output(q, s)
    final = _states(q, s["N"], s, state_v_first) if output_final_state and not pool else None
    h = None
    if inter:
        inner = (s["V"], s["K"]) if state_v_first else (s["K"], s["V"])
        h = empty_like_framework(q, (s["B"], s["num_chunks"], s["HV"], *inner), np_dtype(k))
    _core.chunk_kda(o=for_core(o, "o"), final_state=None if final is None else for_core(final, "final_state"),
                    intermediate_states=None if h is None else for_core(h, "intermediate_states"), **args)
    if pool:
        final = initial_state if output_final_state else None
    return (o, final, h) if inter else (o, final)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    """Chunked KDA prefill: fla's ``chunk_kda`` (fla-core 0.6.0's signature and defaults).

    q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``, g ``[B, T, HV, K]``, beta ``[B, T, HV]`` (HV a multiple
    of H: grouped value heads; K, V <= 256): float32, bfloat16 or float16 (q, k and v each its own, as fla: see docs/fla-api.md). With
    ``cu_seqlens`` (``[N + 1]``) B must be 1 and the T tokens are N packed sequences; without it the B
    rows are N = B sequences of T tokens. ``g`` is the log decay, or the raw gate with
    ``use_gate_in_kernel`` (``A_log`` [HV], ``dt_bias`` [HV*K] as keywords; with ``lower_bound`` fla's
    sigmoid gate). States are float32 ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``).

    ``return_intermediate_states``: also return h, the state at the start of every chunk of
    ``chunk_size`` tokens (chunk 0: the initial state, or zeros) in k's dtype, ``[B, NT, HV, K, V]``
    (``[B, NT, HV, V, K]`` with ``state_v_first``): NT = ceil(T / chunk_size) per row without
    ``cu_seqlens``, else (B = 1) the chunks of all the sequences, sequence after sequence.

    Keywords beyond the signature, as fla takes them: ``A_log``, ``dt_bias``, ``chunk_size`` (32 or
    64), ``transpose_state_layout`` (deprecated); kda's own: ``state_indices`` ([N] int, negative:
    padding) makes ``initial_state`` a pool ``[S, HV, K, V]`` that sequence n reads and writes at
    ``state_indices[n]`` in place (returned as the final state), and ``kernel`` ("auto" |
    "reference" | "optimized"). Any other keyword is a TypeError; ``cp_context`` (context
    parallelism) is refused. ``cu_seqlens_cpu`` (fla's host copy of cu_seqlens), given with
    ``cu_seqlens``, must hold its values (a ValueError otherwise); kda.torch sizes h from it under
    torch.compile.

    Returns ``(o, final_state or None)``, or ``(o, final_state or None, h)`` with
    ``return_intermediate_states``; o ``[B, T, HV, V]`` has q's dtype, in q's framework (torch in,
    torch out; else numpy).
    """
    state_v_first = _chunk_keywords(state_v_first, cp_context, return_intermediate_states, disable_recompute, kwargs,
                                    q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    host_cu_seqlens("chunk_kda", cu_seqlens_cpu, cu_seqlens)
    return _run_chunk("kda", q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                      use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                      state_v_first, cu_seqlens, return_intermediate_states, kwargs)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """Chunked Gated DeltaNet prefill: fla's ``chunk_gated_delta_rule`` (fla-core 0.6.0's signature and
    defaults).

    As :func:`chunk_kda` with a scalar gate per value head: g ``[B, T, HV]`` (the log decay, or the
    raw gate with ``use_gate_in_kernel``: ``-exp(A_log) * softplus(g + dt_bias)``, ``A_log`` and
    ``dt_bias`` ``[HV]``). Keywords beyond the signature, as fla takes them: ``use_gate_in_kernel``,
    ``A_log``, ``dt_bias``, ``chunk_size`` (16, 32 or 64; o and the final state do not depend on it),
    ``transpose_state_layout`` (deprecated), ``head_first`` (refused as fla does); kda's own
    ``state_indices`` (the pool form of chunk_kda) and ``kernel``. Any other keyword is a TypeError;
    ``cp_context`` is refused. ``chunk_indices`` (fla's precomputed chunk list) is accepted as a hint;
    ``cu_seqlens_cpu``, given with ``cu_seqlens``, must hold its values.

    Returns ``(o, final_state or None)`` (the pool itself with ``state_indices`` and
    ``output_final_state``); o ``[B, T, HV, V]`` has v's dtype (fla's), in q's framework.
    """
    state_v_first = _gdn_chunk_keywords(state_v_first, cp_context, kwargs, q=q, k=k, v=v, g=g, beta=beta,
                                        initial_state=initial_state)
    host_cu_seqlens("chunk_gated_delta_rule", cu_seqlens_cpu, cu_seqlens)
    return _run_chunk("gated_delta_rule", q, k, v, g, beta, scale, initial_state, output_final_state,
                      use_qk_l2norm_in_kernel, kwargs.get("use_gate_in_kernel", False), use_beta_sigmoid_in_kernel,
                      allow_neg_eigval, False, None, state_v_first, cu_seqlens, False, kwargs)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, **kwargs):
    """The KDA recurrence token by token: fla's public ``fused_recurrent_kda``.

    Shapes as :func:`chunk_kda` (beta may also be ``[B, T, HV, V]``, a beta per value); any number of
    tokens per sequence. States are contiguous: ``initial_state`` ``[N, HV, K, V]`` (None: zeros) is
    read, and with ``output_final_state`` a new ``[N, HV, K, V]`` with each sequence's final state is
    returned. The pool keywords of :func:`fused_recurrent_kda_fwd` (``ssm_state_indices``,
    ``num_accepted_tokens``, ``inplace_final_state``, ``out``), which fla's public function would
    ignore, are honoured with that entry's meaning and defaults. ``transpose_state_layout``
    (deprecated), ``kernel`` and fla's hints (``disable_recompute``, ``cu_seqlens_cpu``,
    ``use_graph``, ``max_num_seqs``: ignored, as fla's **kwargs drops them) are accepted; any other
    keyword is a TypeError. Torch tensors that require grad are read, and the results have no graph
    (as fla: no backward).

    Returns ``(o, final_state or None)``.
    """
    return public_recurrent(fused_recurrent_kda_fwd, q, k, v, g, beta, A_log, dt_bias, scale, initial_state,
                            output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                            use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, cu_seqlens,
                            kwargs)


def _run_recurrent(entry: str, q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state,
                   inplace_final_state, state_v_first, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                   use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                   lower_bound, out, kernel):
    """The recurrent kernel through the core (keywords handled): ``(o, final_state)`` with the _fwd
    entries' meaning."""
    args = _common(q, k, v, g, beta, scale, cu_seqlens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                   use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first, A_log, dt_bias, kernel)
    pool = ssm_state_indices is not None
    args.update(
        output_final_state=bool(output_final_state), inplace_final_state=bool(inplace_final_state), entry=entry,
        ssm_state_indices=None if not pool else int_array(ssm_state_indices, "ssm_state_indices", np.int32),
        num_accepted_tokens=None if num_accepted_tokens is None else int_array(num_accepted_tokens,
                                                                               "num_accepted_tokens", np.int32))
    if initial_state is None:
        state = None
    elif inplace_final_state:
        state = for_core_writable(initial_state, "initial_state")
    else:
        state = for_core(initial_state, "initial_state")
    s = _core.fused_recurrent_kda(o=None, final_state=None, initial_state=state, check_only=True, **args)
    o = _output(q, s, like=v) if out is None else out
    final = None
    if not inplace_final_state and output_final_state:
        # A state per token with indices: zeros where nothing is written (padding sequences).
        final = _states(q, s["B"] * s["T"] if pool else s["N"], s, state_v_first, zero=pool)
    _core.fused_recurrent_kda(o=for_core_writable(o, "out"),
                              final_state=None if final is None else for_core(final, "final_state"),
                              initial_state=state, **args)
    return o, (initial_state if inplace_final_state else final)


def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                            output_final_state=False, inplace_final_state=True, state_v_first=False,
                            cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, out=None,
                            **kwargs):
    """fla's / vLLM's pool and speculative-decoding entry ``fused_recurrent_kda_fwd``.

    With ``ssm_state_indices`` ([N] or [N, C] int32; negative: padding, zero outputs and no state
    touched) the states live in the float32 pool ``initial_state`` ``[S, HV, K, V]``; sequence n starts
    from slot ``[n, num_accepted_tokens[n] - 1]`` (2-D indices; else ``[n]``). With
    ``inplace_final_state`` (the default) the states go back into ``initial_state``: 2-D indices write
    the state after token t to slot ``[n, t]`` (negative: not written), 1-D indices the final state
    to slot ``[n]``, and without indices state n of an ``[N, HV, K, V]`` buffer. Otherwise, with
    ``output_final_state``, a new buffer receives them: ``[N, HV, K, V]`` without indices, and with
    indices the state after every token (row ``bos + t`` of ``[B * T, HV, K, V]``; zeros for padding
    sequences). ``out``: o's buffer (v's shape and dtype), written in place. ``transpose_state_layout``
    (deprecated), ``kernel`` and fla's hints (ignored) are accepted; any other keyword is a TypeError.
    Torch tensors that require grad are read (no backward, as fla).

    Returns ``(o, final_state)`` (final_state: initial_state itself with inplace_final_state, else
    the new buffer or None).
    """
    state_v_first = _fwd_keywords(state_v_first, kwargs)
    return _run_recurrent("kda", q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state,
                          inplace_final_state, state_v_first, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                          use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
                          lower_bound, out, kwargs.get("kernel", "auto"))


def _np_f32(x) -> np.ndarray:
    """Any array as float32 numpy (a torch tensor detached, on the host)."""
    if is_torch(x):
        import torch

        x = x.detach().to(device="cpu", dtype=torch.float32).numpy()
    return np.asarray(x, dtype=np.float32)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, **kwargs):
    """The Gated DeltaNet recurrence token by token: fla's public ``fused_recurrent_gated_delta_rule``
    (its argument order, which differs from chunk_gated_delta_rule's).

    Shapes as :func:`chunk_gated_delta_rule` (beta may also be ``[B, T, HV, V]``); any number of tokens
    per sequence. The decay: ``g`` ``[B, T, HV]`` (the raw gate with ``use_gate_in_kernel``, which
    requires ``A_log`` and g; ``dt_bias`` [HV] optional; without the gate both are ignored, as fla),
    ``gk`` ``[B, T, HV, K]`` a decay per key dimension (the KDA recurrence), both: their sum (fla
    multiplies the two decays; g is activated first with ``use_gate_in_kernel``, as fla's kernel
    applies the gate to g only), neither: no decay. ``gv`` (a decay per value dimension) is refused
    (NotImplementedError). ``beta`` None: ones. States as :func:`fused_recurrent_kda`, with its pool
    keywords (``ssm_state_indices``, ``num_accepted_tokens``, ``inplace_final_state``, ``out``)
    honoured with :func:`fused_recurrent_gated_delta_rule_fwd`'s meaning; ``transpose_state_layout``
    (deprecated), ``kernel`` and the hints ``cu_seqlens_cpu``, ``chunk_indices`` are accepted, any
    other keyword is a TypeError. Torch tensors that require grad are read, and the results have no
    graph (fla's entry has no backward).

    Returns ``(o, final_state or None)``.
    """
    ops = GateOps(full=lambda shape, value: np.full(shape, value, np.float32), f32=_np_f32,
                  gate=lambda x, a, b: fused_gdn_gate(_np_f32(x), a, b))
    return public_gdn_recurrent(fused_recurrent_gated_delta_rule_fwd, ops, q, k, v, g, gk, gv, beta, scale,
                                initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log,
                                dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens,
                                kwargs)


def fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True,
                                         cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                         retrieve_parent_token=None, use_qk_l2norm_in_kernel=False, *, A_log=None,
                                         dt_bias=None, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                                         allow_neg_eigval=False, state_v_first=False, output_final_state=True,
                                         out=None, **kwargs):
    """vLLM's Gated DeltaNet pool and speculative-decoding entry ``fused_recurrent_gated_delta_rule_fwd``
    (vLLM's positional order), with the pool semantics of :func:`fused_recurrent_kda_fwd`.

    g ``[B, T, HV]`` (a scalar gate per value head; ``[B, T, HV, K]`` runs the KDA recurrence), beta
    ``[B, T, HV]`` or ``[B, T, HV, V]``. ``ssm_state_indices`` ([N] or [N, C] int32; negative:
    padding), ``num_accepted_tokens``, ``inplace_final_state`` (default True: the states go back into
    ``initial_state``) as :func:`fused_recurrent_kda_fwd`. ``output_final_state`` defaults to True
    here, so that a call with ``inplace_final_state=False`` returns the new states as vLLM's does
    (with indices the state after every token, ``[B * T, HV, K, V]``; without, ``[N, HV, K, V]``).
    ``retrieve_parent_token`` (tree speculative decoding) is refused (NotImplementedError). kda's
    keywords: ``A_log``, ``dt_bias`` ([HV]), ``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``,
    ``allow_neg_eigval``, ``state_v_first``, ``output_final_state``, ``out`` (o's buffer, written in
    place), ``kernel``, ``transpose_state_layout`` (deprecated), the hints ``cu_seqlens_cpu`` and
    ``chunk_indices``; any other keyword is a TypeError. Torch tensors that require grad are read
    (no backward).

    Returns ``(o, final_state)`` (initial_state itself with inplace_final_state, else the new buffer
    or None).
    """
    state_v_first = _fwd_keywords(state_v_first, kwargs, who="fused_recurrent_gated_delta_rule_fwd",
                                  hints=_GDN_HINTS)
    refuse_tree(retrieve_parent_token)
    return _run_recurrent("gated_delta_rule", q, k, v, g, beta, A_log, dt_bias, initial_state, scale,
                          output_final_state, inplace_final_state, state_v_first, cu_seqlens, ssm_state_indices,
                          num_accepted_tokens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                          use_beta_sigmoid_in_kernel, allow_neg_eigval, None, out, kwargs.get("kernel", "auto"))


def check_gate_form(A_log, lower_bound):
    """fused_kda_gate's forms: the softplus one needs A_log; the sigmoid one (lower_bound) may omit it."""
    if A_log is None and lower_bound is None:
        raise ValueError("fused_kda_gate: A_log is required when lower_bound is not set")


def _softplus(x: np.ndarray) -> np.ndarray:
    """softplus(x) = log(1 + e^x), x itself above 20 (torch's threshold, as fla's kernels)."""
    with np.errstate(over="ignore"):
        return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _gate_input(who: str, g, A_log, dt_bias, shape_text: str, min_ndim: int):
    """A gate's operands in float32 numpy: (torch_in, x, a) with ``x`` the gate's input g (``[..., HV]``
    or ``[..., HV, K]``) and ``a`` A_log (HV elements, or None); tensors that require grad are refused."""
    torch_in = is_torch(g)
    if torch_in:
        _check_grad(who, g=g, A_log=A_log, dt_bias=dt_bias)
    x = _np_f32(g)
    if x.ndim < min_ndim:
        raise ValueError(f"{who}: g: expected shape {shape_text}, got {list(x.shape)}")
    hv = x.shape[-min_ndim]
    a = None if A_log is None else param_f32(A_log, "A_log")
    if a is not None and a.size != hv:
        raise ValueError(f"{who}: A_log: expected HV = {hv} elements, got {list(a.shape)}")
    return torch_in, x, a


def _gate_output(y: np.ndarray, torch_in: bool, output_dtype):
    """A gate's float32 result in the input's framework, as ``output_dtype`` (None: float32)."""
    y = y.astype(np.float32)
    if torch_in:
        import torch

        t = torch.from_numpy(y)
        return t if output_dtype is None else t.to(output_dtype)
    return y if output_dtype is None else y.astype(output_dtype)


def fused_kda_gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=None):
    """fla's ``fused_kda_gate``: the activated forget gate alone (the in-kernel gate's formula).

    g ``[..., HV, K]``; x = g + dt_bias (``[HV * K]``, optional). ``-exp(A_log) * softplus(x)``
    (softplus(x) = x above 20), or with ``lower_bound`` ``lower_bound * sigmoid(exp(A_log) * x)``
    (``A_log`` None, with ``lower_bound`` only: ``lower_bound * sigmoid(x)``). Computed in float32,
    returned as ``output_dtype`` (default float32), in g's framework.
    """
    who = "fused_kda_gate"
    check_gate_form(A_log, lower_bound)
    torch_in, x, a = _gate_input(who, g, A_log, dt_bias, "[..., HV, K]", 2)
    hv, kd = x.shape[-2:]
    if dt_bias is not None:
        bias = param_f32(dt_bias, "dt_bias")
        if bias.size != hv * kd:
            raise ValueError(f"{who}: dt_bias: expected HV*K = {hv * kd} elements, got {list(bias.shape)}")
        x = x + bias.reshape(hv, kd)
    if lower_bound is not None:
        scale = np.float32(1.0) if a is None else np.exp(a).reshape(hv, 1)
        with np.errstate(over="ignore"):
            y = np.float32(lower_bound) / (np.float32(1.0) + np.exp(-(scale * x)))
    else:
        y = -np.exp(a).reshape(hv, 1) * _softplus(x)
    return _gate_output(y, torch_in, output_dtype)


def fused_gdn_gate(g, A_log, dt_bias=None, output_dtype=None):
    """fla's ``fused_gdn_gate``: the Gated DeltaNet forget gate alone, ``-exp(A_log) * softplus(g + dt_bias)``.

    g ``[..., HV]``; ``A_log`` HV elements; ``dt_bias`` ``[HV]`` (optional); softplus(x) = x above 20.
    Computed in float32, returned as ``output_dtype`` (default float32), in g's framework.
    """
    who = "fused_gdn_gate"
    if A_log is None:
        raise ValueError(f"{who}: A_log is required")
    torch_in, x, a = _gate_input(who, g, A_log, dt_bias, "[..., HV]", 1)
    hv = x.shape[-1]
    if dt_bias is not None:
        bias = param_f32(dt_bias, "dt_bias")
        if bias.size != hv:
            raise ValueError(f"{who}: dt_bias: expected HV = {hv} elements, got {list(bias.shape)}")
        x = x + bias.reshape(hv)
    return _gate_output(-np.exp(a).reshape(hv) * _softplus(x), torch_in, output_dtype)
