"""KDA and Gated DeltaNet kernels for JAX, with fla's signatures (fla-core 0.6.0; docs/fla-api.md).

- :func:`chunk_kda` (prefill over a batch, or packed variable-length with ``cu_seqlens``),
  :func:`fused_recurrent_kda` (fla's public entry: the recurrence token by token) and
  :func:`fused_recurrent_kda_fwd` (vLLM's pool and speculative-decoding entry) take the arguments,
  order, defaults and refusals of kda's numpy entries (:func:`kda.chunk_kda` etc.), and
  :func:`fused_kda_gate` computes the in-kernel gate alone.
- Gated DeltaNet (GDN: a scalar decay per value head, g [B, T, HV]): :func:`chunk_gated_delta_rule`,
  :func:`fused_recurrent_gated_delta_rule` (fla's entries), :func:`fused_recurrent_gated_delta_rule_fwd`
  (vLLM's pool and speculative-decoding entry, with the pool semantics of ``fused_recurrent_kda_fwd``)
  and :func:`fused_gdn_gate`, on the same kernels and conventions.
- Mamba2's SSD scan with mamba_ssm's names (:mod:`kda.jax.mamba_ssm`): :func:`mamba_chunk_scan_combined`
  (prefill) and :func:`selective_state_update` (a decode step, returning ``(out, new_state)``), the
  semantics of :mod:`kda.mamba_ssm` on these kernels without the delta correction.

The kernel entries dispatch to one of two backends:

  - ``"ffi"``: the project's optimized C++ kernels as XLA FFI custom calls on the CPU platform
    (:mod:`kda.jax.ffi`; the library ``libkda_xla_ffi.so`` from ``$KDA_XLA_FFI_LIBRARY`` or the
    package directory);
  - ``"naive"``: the pure-JAX recurrence (:mod:`kda.jax.naive`), any platform.

  The default, ``"auto"``, is the FFI kernels, falling back to the naive ones when the library cannot
  load; the fallback is logged once (logger ``kda.jax``, warning) and :func:`backend` tells which is in
  use. Choose per call with the keyword ``kernel="auto"|"ffi"|"naive"`` or process-wide with
  :func:`set_backend` (or the ``KDA_JAX_KERNEL`` environment variable, read at import).

Shapes: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] (KDA) or [B, T, HV] (GDN, dt_bias [HV]);
beta [B, T, HV] (the recurrent entries also [B, T, HV, V]); HV a multiple of H; K, V <= 256. q, k, v
float32, bfloat16 or float16 (each its own, as fla); o [B, T, HV, V] in q's dtype (chunk entries) or v's
(recurrent ones). With ``cu_seqlens`` ([N + 1])
B = 1 and the T tokens are N packed sequences; without it each of the B rows is a sequence. States are
float32 [N, HV, K, V] ([.., HV, V, K] with ``state_v_first``); pools [S, HV, K, V]. All math is fp32.
``scale`` and ``lower_bound`` are static Python floats, ``chunk_size`` and ``num_chunks`` static ints.

JAX arrays are immutable: what the other front ends update in place is returned. ``chunk_kda`` (and
``chunk_gated_delta_rule``) with ``state_indices`` returns the updated pool as its second result (whatever
``output_final_state`` says); ``fused_recurrent_kda_fwd`` (and ``fused_recurrent_gated_delta_rule_fwd``)
with ``inplace_final_state`` (its default) returns the updated ``initial_state``, and with ``out`` o in
that buffer. Those arrays are donated by an eager call (it
consumes the array passed in; the result is the same buffer) and aliased to the result in the FFI
call, so that under an outer ``jax.jit`` that donates them (``donate_argnums``) the kernel updates
them in place; otherwise XLA copies them first. Use the returned arrays.

``chunk_kda(return_intermediate_states=True)`` returns (o, final_state, h), h [B, NT, HV, K, V] in k's
dtype, chunk j of a sequence the state before its token j * chunk_size (with ``cu_seqlens`` B = 1 and
NT the chunks of all sequences). Its size must be static: a traced ``cu_seqlens`` needs the static
keyword ``num_chunks`` (kda.jax's own; checked against the values as they are, below), or fla's
``cu_seqlens_cpu`` with concrete values (numpy, a list), from which the count is taken.

Bad arguments raise ValueError / TypeError naming the argument at trace time (for an eager call: at
the call), for both backends: the C++ call description's checks (kda/kernels/kda_args.h, through
kda._core), its messages unchanged. Index values are checked by the same rules wherever they are
known:

- concrete (an eager call, or constants under ``jax.jit``): ``cu_seqlens``, ``state_indices`` /
  ``ssm_state_indices`` (1-D and 2-D) and ``num_accepted_tokens`` at trace time, a ValueError;
- traced (under ``jax.jit``): when the call runs, by the FFI kernels themselves, or for the naive
  kernels by the core's check on the values in a host callback (``jax.experimental.io_callback``) that
  every result depends on. A bad value (or a ``num_chunks`` the traced ``cu_seqlens`` disagree with)
  fails the call with ``jax.errors.JaxRuntimeError`` carrying the same message, raised where the
  results are awaited (e.g. ``jax.block_until_ready``); no wrong result is returned.

A concrete array on a GPU or TPU passed to the FFI kernels is a ValueError (they are registered for
the CPU only).
"""

from __future__ import annotations

import functools
import logging
import os

import jax
import numpy as np

from .. import _kernels
from . import _args, ffi, naive

logger = logging.getLogger("kda.jax")

KERNELS = ("auto", "ffi", "naive")

_default = {"kernel": "auto", "warned": False}


def _check_kernel(kernel: str) -> str:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    return kernel


def set_backend(kernel: str) -> None:
    """The process-wide default for calls without ``kernel=``: "auto" (FFI, else naive), "ffi" or "naive"."""
    _default["kernel"] = _check_kernel(kernel)


def get_backend_setting() -> str:
    """What :func:`set_backend` (or ``KDA_JAX_KERNEL``) chose: "auto", "ffi" or "naive"."""
    return _default["kernel"]


def backend(kernel: str | None = None) -> str:
    """The backend a call with ``kernel`` (None: the default) runs: "ffi" or "naive".

    "auto" resolves to "ffi" when the library loads, else to "naive" (logged once). "ffi" when the library
    cannot load raises RuntimeError with the reason.
    """
    kernel = _check_kernel(_default["kernel"] if kernel is None else kernel)
    if kernel == "naive":
        return "naive"
    if ffi.load():
        return "ffi"
    if kernel == "ffi":
        raise RuntimeError(f"kernel='ffi': the kda XLA FFI kernels are not available: {ffi.load_error()}")
    if not _default["warned"]:
        _default["warned"] = True
        logger.warning("kda.jax: XLA FFI kernels unavailable, using the pure-JAX naive kernels (%s)",
                       ffi.load_error())
    return "naive"


def ffi_load_error() -> str | None:
    """Why the FFI library did not load, or None when it did."""
    return ffi.load_error()


# --- jitted cores: the statics as a static argument, state and out donated where they are updated ----------


def _core(state, out, rest, *, st, impl):
    call = _args.Call.join(st, state, out, rest)
    return ffi.run(call) if impl == "ffi" else naive.run(call)


@functools.lru_cache(maxsize=None)
def _jitted(donate: tuple):
    return jax.jit(_core, static_argnames=("st", "impl"), donate_argnums=donate)


def _run(call: _args.Call, impl: str, who: str, donate_state: bool):
    if impl == "ffi":
        ffi.check_cpu(who, call)
    state, out, rest = call.split()
    donate = tuple(i for i, d in ((0, donate_state and state is not None), (1, out is not None)) if d)
    return _jitted(donate)(state, out, rest, st=call.st, impl=impl)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    """Chunked KDA prefill: fla's ``chunk_kda`` (the signature and defaults of :func:`kda.chunk_kda`).

    Keywords beyond the signature: ``A_log`` [HV], ``dt_bias`` [HV * K] (read with
    ``use_gate_in_kernel``), ``chunk_size`` (32 or 64), ``transpose_state_layout`` (deprecated),
    ``state_indices`` ([N] int; negative: padding): ``initial_state`` is a pool [S, HV, K, V] that
    sequence n reads and writes at ``state_indices[n]``, returned updated as the second result;
    ``num_chunks`` (static NT of the intermediate states) and ``kernel`` ("auto" | "ffi" | "naive").
    Any other keyword is a TypeError; ``cp_context`` is refused. ``cu_seqlens_cpu`` (cu_seqlens' values
    on the host), where concrete, must hold cu_seqlens' values when those are concrete too, and gives
    ``num_chunks`` when cu_seqlens is traced; fla's other hints are accepted and ignored.

    Returns ``(o, final_state or None)``, or ``(o, final_state, h)`` with ``return_intermediate_states``.
    """
    num_chunks = kwargs.pop("num_chunks", None)  # kda.jax's own keyword; the others as the numpy entry's
    state_v_first = _kernels._chunk_keywords(state_v_first, cp_context, return_intermediate_states, disable_recompute,
                                             kwargs)
    impl = backend(kwargs.get("kernel"))
    state_indices = kwargs.get("state_indices")
    if _args.is_concrete(cu_seqlens_cpu):  # traced: no values to read, a hint like the others
        host = _kernels.host_cu_seqlens("chunk_kda", cu_seqlens_cpu, cu_seqlens, known=_args.is_concrete(cu_seqlens))
        chunk_size = kwargs.get("chunk_size", 64)
        if (host is not None and return_intermediate_states and num_chunks is None
                and isinstance(chunk_size, (int, np.integer)) and not isinstance(chunk_size, bool)):
            num_chunks = _kernels.chunk_count(host, int(chunk_size))
    call = _args.check_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                             return_intermediate_states, state_v_first, cu_seqlens, kwargs.get("A_log"),
                             kwargs.get("dt_bias"), kwargs.get("chunk_size", 64), state_indices, num_chunks)
    return _run(call, impl, "chunk_kda", donate_state=state_indices is not None)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, **kwargs):
    """fla's public ``fused_recurrent_kda`` (as :func:`kda.fused_recurrent_kda`): the recurrence token by
    token with contiguous states, ``initial_state`` [N, HV, K, V] (None: zeros) read and, with
    ``output_final_state``, a new [N, HV, K, V] returned. The pool keywords of
    :func:`fused_recurrent_kda_fwd` are honoured with its meaning and defaults; ``kernel`` as chunk_kda.

    Returns ``(o, final_state or None)``.
    """
    return _kernels.public_recurrent(fused_recurrent_kda_fwd, q, k, v, g, beta, A_log, dt_bias, scale,
                                     initial_state, output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                                     use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, state_v_first,
                                     cu_seqlens, kwargs)


def fused_recurrent_kda_fwd(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                            output_final_state=False, inplace_final_state=True, state_v_first=False,
                            cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                            use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                            use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None, out=None,
                            **kwargs):
    """fla's / vLLM's pool and speculative-decoding entry (as :func:`kda.fused_recurrent_kda_fwd`).

    With ``ssm_state_indices`` ([N] or [N, C] int32; negative: padding) the states live in the pool
    ``initial_state`` [S, HV, K, V]; sequence n starts from slot ``[n, num_accepted_tokens[n] - 1]``
    (2-D) or ``[n]`` (1-D). With ``inplace_final_state`` (the default) the states go back into
    ``initial_state`` (2-D: the state after token t to slot ``[n, t]``; 1-D: the final state to slot
    ``[n]``; no indices: state n of [N, HV, K, V]) and the updated array is returned. Otherwise, with
    ``output_final_state``, a new array: [N, HV, K, V], or with indices the state after every token
    (row ``bos + t`` of [B * T, HV, K, V]; zeros for padding sequences). ``out``: o's buffer (v's
    shape and dtype), donated and returned as o. ``kernel`` as chunk_kda.

    Returns ``(o, the updated initial_state, or the new states, or None)``.
    """
    state_v_first = _kernels._fwd_keywords(state_v_first, kwargs)
    impl = backend(kwargs.get("kernel"))
    call = _args.check_recurrent(q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state,
                                 inplace_final_state, state_v_first, cu_seqlens, ssm_state_indices,
                                 num_accepted_tokens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                                 use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, out)
    return _run(call, impl, "fused_recurrent_kda_fwd", donate_state=bool(inplace_final_state))


def fused_kda_gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=None):
    """fla's ``fused_kda_gate`` (as :func:`kda.fused_kda_gate`): the in-kernel gate alone, pure JAX.

    g [..., HV, K]; x = g + dt_bias ([HV * K], optional): ``-exp(A_log) * softplus(x)``, or with
    ``lower_bound`` ``lower_bound * sigmoid(exp(A_log) * x)`` (A_log optional there). Computed in
    float32, returned as ``output_dtype`` (default float32).
    """
    who = "fused_kda_gate"
    _kernels.check_gate_form(A_log, lower_bound)
    g = _args.as_array(who, "g", g)
    if g.ndim < 2:
        raise ValueError(f"{who}: g: expected shape [..., HV, K], got {list(g.shape)}")
    hv, kd = (int(d) for d in g.shape[-2:])
    bias = _args.as_array(who, "dt_bias", dt_bias)
    if bias is not None and bias.size != hv * kd:
        raise ValueError(f"{who}: dt_bias: expected HV*K = {hv * kd} elements, got {list(bias.shape)}")
    a = _args.as_array(who, "A_log", A_log)
    if a is not None and a.size != hv:
        raise ValueError(f"{who}: A_log: expected HV = {hv} elements, got {list(a.shape)}")
    f32 = jax.numpy.float32
    y = naive.kda_gate(g.astype(f32), None if a is None else a.astype(f32).reshape(hv),
                       None if bias is None else bias.astype(f32).reshape(hv * kd),
                       _args.static_float(who, "lower_bound", lower_bound))
    return y.astype(f32 if output_dtype is None else output_dtype)


# --- Gated DeltaNet ---------------------------------------------------------------------------------------


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                           state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                           cp_context=None, **kwargs):
    """Chunked Gated DeltaNet prefill: fla's ``chunk_gated_delta_rule`` (as :func:`kda.chunk_gated_delta_rule`):
    the recurrence of :func:`chunk_kda` with a scalar decay per value head.

    g [B, T, HV]: the log decay, or with ``use_gate_in_kernel`` the raw gate, ``-exp(A_log) * softplus(g +
    dt_bias)``. Keywords beyond the signature, as fla takes them: ``use_gate_in_kernel``, ``A_log`` [HV],
    ``dt_bias`` [HV], ``chunk_size`` (16, 32 or 64; the results do not depend on it),
    ``transpose_state_layout`` (deprecated); kda's own, as chunk_kda's: ``state_indices`` ([N] int;
    negative: padding): ``initial_state`` is a pool [S, HV, K, V] that sequence n reads and writes at
    ``state_indices[n]``, returned updated as the second result; ``kernel`` ("auto" | "ffi" | "naive").
    Any other keyword is a TypeError; ``cp_context`` is refused. ``chunk_indices`` is accepted as a hint;
    ``cu_seqlens_cpu``, where concrete, must hold cu_seqlens' values when those are concrete too.

    Returns ``(o, final_state or None)``.
    """
    state_v_first = _kernels._gdn_chunk_keywords(state_v_first, cp_context, kwargs)
    impl = backend(kwargs.get("kernel"))
    if _args.is_concrete(cu_seqlens_cpu):  # traced: no values to read, a hint like the others
        _kernels.host_cu_seqlens("chunk_gated_delta_rule", cu_seqlens_cpu, cu_seqlens,
                                 known=_args.is_concrete(cu_seqlens))
    state_indices = kwargs.get("state_indices")
    call = _args.check_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             kwargs.get("use_gate_in_kernel", False), use_beta_sigmoid_in_kernel, allow_neg_eigval,
                             False, None, False, state_v_first, cu_seqlens, kwargs.get("A_log"),
                             kwargs.get("dt_bias"), kwargs.get("chunk_size", 64), state_indices, None,
                             entry="gated_delta_rule")
    return _run(call, impl, "chunk_gated_delta_rule", donate_state=state_indices is not None)


# The gate arithmetic of fla's public GDN recurrence (no decay, beta ones, g and gk combined) in JAX arrays.
_GATE_OPS = _kernels.GateOps(full=lambda shape, value: jax.numpy.full(shape, value, jax.numpy.float32),
                             f32=lambda x: jax.numpy.asarray(x).astype(jax.numpy.float32),
                             gate=lambda g, A_log, dt_bias: fused_gdn_gate(g, A_log, dt_bias))


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                                     cu_seqlens=None, **kwargs):
    """fla's public ``fused_recurrent_gated_delta_rule`` (as :func:`kda.fused_recurrent_gated_delta_rule`):
    the recurrence token by token with contiguous states, ``initial_state`` [N, HV, K, V] (None: zeros)
    read and, with ``output_final_state``, a new [N, HV, K, V] returned.

    The decay: ``g`` [B, T, HV] (a scalar per value head; the raw gate with ``use_gate_in_kernel``, which
    needs ``A_log`` [HV]; ``dt_bias`` [HV] optional), ``gk`` [B, T, HV, K] (one per key dimension: KDA's
    recurrence), both (their sum: fla multiplies the decays, g activated first with ``use_gate_in_kernel``),
    or neither (no decay); ``gv`` is refused. ``beta`` None: ones. The pool keywords of
    :func:`fused_recurrent_gated_delta_rule_fwd` (``ssm_state_indices``, ``num_accepted_tokens``,
    ``inplace_final_state``, ``out``) are honoured with its meaning and defaults; ``kernel`` as chunk_kda;
    ``transpose_state_layout`` and the hints ``cu_seqlens_cpu``, ``chunk_indices`` are accepted; any other
    keyword is a TypeError.

    Returns ``(o, final_state or None)``.
    """
    return _kernels.public_gdn_recurrent(fused_recurrent_gated_delta_rule_fwd, _GATE_OPS, q, k, v, g, gk, gv, beta,
                                         scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                                         use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                                         allow_neg_eigval, state_v_first, cu_seqlens, kwargs)


def fused_recurrent_gated_delta_rule_fwd(q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True,
                                         cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                                         retrieve_parent_token=None, use_qk_l2norm_in_kernel=False, *, A_log=None,
                                         dt_bias=None, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                                         allow_neg_eigval=False, state_v_first=False, output_final_state=True,
                                         out=None, **kwargs):
    """vLLM's Gated DeltaNet pool and speculative-decoding entry (as
    :func:`kda.fused_recurrent_gated_delta_rule_fwd`), with the semantics of :func:`fused_recurrent_kda_fwd`.

    g [B, T, HV] (a scalar decay per value head; [B, T, HV, K] runs KDA's recurrence); beta [B, T, HV] or
    [B, T, HV, V]. With ``ssm_state_indices`` ([N] or [N, C] int32; negative: padding) the states live in
    the pool ``initial_state`` [S, HV, K, V]; sequence n starts from slot ``[n, num_accepted_tokens[n] -
    1]`` (2-D) or ``[n]`` (1-D). With ``inplace_final_state`` (the default) the states go back into
    ``initial_state`` (2-D: the state after token t to slot ``[n, t]``; 1-D: the final state to slot
    ``[n]``; no indices: state n of [N, HV, K, V]) and the updated array is returned. Otherwise, with
    ``output_final_state`` (default True here, as vLLM returns them), a new array: [N, HV, K, V], or with
    indices the state after every token (row ``bos + t`` of [B * T, HV, K, V]). ``out``: o's buffer,
    donated and returned as o. ``retrieve_parent_token`` (tree drafts) is refused. The keyword-only
    arguments are kda's; ``kernel`` as chunk_kda; ``transpose_state_layout`` and the hints
    ``cu_seqlens_cpu``, ``chunk_indices`` are accepted; any other keyword is a TypeError.

    Returns ``(o, the updated initial_state, or the new states, or None)``.
    """
    who = "fused_recurrent_gated_delta_rule_fwd"
    state_v_first = _kernels._fwd_keywords(state_v_first, kwargs, who=who, hints=_kernels._GDN_HINTS)
    _kernels.refuse_tree(retrieve_parent_token)
    impl = backend(kwargs.get("kernel"))
    for name, x in (("g", g), ("beta", beta)):
        if x is None:
            raise TypeError(f"{who}: {name}: expected an array, got None")
    call = _args.check_recurrent(q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state,
                                 inplace_final_state, state_v_first, cu_seqlens, ssm_state_indices,
                                 num_accepted_tokens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                                 use_beta_sigmoid_in_kernel, allow_neg_eigval, None, out, entry="gated_delta_rule")
    return _run(call, impl, who, donate_state=bool(inplace_final_state))


def fused_gdn_gate(g, A_log, dt_bias=None, output_dtype=jax.numpy.float32):
    """fla's ``fused_gdn_gate`` (as :func:`kda.fused_gdn_gate`): Gated DeltaNet's gate alone, pure JAX.

    g [..., HV]; ``-exp(A_log) * softplus(g + dt_bias)`` (A_log [HV]; dt_bias [HV], optional; softplus(x) =
    x above 20). Computed in float32, returned as ``output_dtype`` (default float32; None: float32).
    """
    who = "fused_gdn_gate"
    if A_log is None:
        raise ValueError(f"{who}: A_log is required")
    g = _args.as_array(who, "g", g)
    if g.ndim < 1:
        raise ValueError(f"{who}: g: expected shape [..., HV], got {list(g.shape)}")
    hv = int(g.shape[-1])
    a = _args.as_array(who, "A_log", A_log)
    if a.size != hv:
        raise ValueError(f"{who}: A_log: expected HV = {hv} elements, got {list(a.shape)}")
    bias = _args.as_array(who, "dt_bias", dt_bias)
    if bias is not None and bias.size != hv:
        raise ValueError(f"{who}: dt_bias: expected HV = {hv} elements, got {list(bias.shape)}")
    f32 = jax.numpy.float32
    y = naive.gdn_gate(g.astype(f32), a.astype(f32).reshape(hv),
                       None if bias is None else bias.astype(f32).reshape(hv))
    return y.astype(f32 if output_dtype is None else output_dtype)


def _with_kernel(fn, kernel: str):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **kwargs, kernel=kernel)

    call.__doc__ = f"{fn.__name__} on the {kernel} kernels (kernel={kernel!r})."
    return call


# The entries bound to one kernel each: <entry>_ffi (the XLA FFI kernels) and <entry>_jax_naive (pure JAX).
_ENTRIES = (chunk_kda, fused_recurrent_kda, fused_recurrent_kda_fwd, chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule, fused_recurrent_gated_delta_rule_fwd)
(chunk_kda_ffi, fused_recurrent_kda_ffi, fused_recurrent_kda_fwd_ffi, chunk_gated_delta_rule_ffi,
 fused_recurrent_gated_delta_rule_ffi, fused_recurrent_gated_delta_rule_fwd_ffi) = (
    _with_kernel(fn, "ffi") for fn in _ENTRIES)
(chunk_kda_jax_naive, fused_recurrent_kda_jax_naive, fused_recurrent_kda_fwd_jax_naive,
 chunk_gated_delta_rule_jax_naive, fused_recurrent_gated_delta_rule_jax_naive,
 fused_recurrent_gated_delta_rule_fwd_jax_naive) = (_with_kernel(fn, "naive") for fn in _ENTRIES)

# Mamba2's SSD scan with mamba_ssm's names, on these kernels without the delta correction.
from .mamba_ssm import mamba_chunk_scan_combined, selective_state_update  # noqa: E402

if os.environ.get("KDA_JAX_KERNEL"):
    set_backend(os.environ["KDA_JAX_KERNEL"])

__all__ = [
    "KERNELS",
    "backend",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_ffi",
    "chunk_gated_delta_rule_jax_naive",
    "chunk_kda",
    "chunk_kda_ffi",
    "chunk_kda_jax_naive",
    "ffi_load_error",
    "fused_gdn_gate",
    "fused_kda_gate",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_ffi",
    "fused_recurrent_gated_delta_rule_fwd",
    "fused_recurrent_gated_delta_rule_fwd_ffi",
    "fused_recurrent_gated_delta_rule_fwd_jax_naive",
    "fused_recurrent_gated_delta_rule_jax_naive",
    "fused_recurrent_kda",
    "fused_recurrent_kda_ffi",
    "fused_recurrent_kda_fwd",
    "fused_recurrent_kda_fwd_ffi",
    "fused_recurrent_kda_fwd_jax_naive",
    "fused_recurrent_kda_jax_naive",
    "get_backend_setting",
    "mamba_chunk_scan_combined",
    "selective_state_update",
    "set_backend",
]
