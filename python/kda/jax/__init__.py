"""KDA kernels for JAX, with fla's signatures.

- :func:`chunk_kda` (prefill over a batch, packed variable-length with ``cu_seqlens``) and
  :func:`fused_recurrent_kda` (decode, one token per sequence, in place on a state pool) dispatch to
  one of two backends:

  - ``"ffi"``: the project's optimized C++ kernels as XLA FFI custom calls on the CPU platform
    (:mod:`kda.jax.ffi`; the library ``libkda_xla_ffi.so`` from ``$KDA_XLA_FFI_LIBRARY`` or the
    package directory);
  - ``"naive"``: the pure-JAX recurrence (:mod:`kda.jax.naive`), any platform.

  The default, ``"auto"``, is the FFI kernels, falling back to the naive ones when the library cannot
  load; the fallback is logged once (logger ``kda.jax``, warning) and :func:`backend` tells which is in
  use. Choose per call with ``kernel="auto"|"ffi"|"naive"`` or process-wide with :func:`set_backend`
  (or the ``KDA_JAX_KERNEL`` environment variable, read at import).

- :func:`chunk_kda_jax_naive`, :func:`fused_recurrent_kda_jax_naive`: the naive kernels directly;
  :func:`chunk_kda_ffi`, :func:`fused_recurrent_kda_ffi`: the FFI kernels directly.

Shapes: q, k, g [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; q/k/v fp32 or bf16 (one dtype), g and
beta fp32 or bf16; o [B, T, H, V] in q's dtype. With ``cu_seqlens`` ([N + 1], int32 or int64) B = 1
and the T tokens are N packed sequences; without it each of the B rows is a sequence. States are
fp32 [N, H, K, V]; pools [S, H, K, V]. All math is fp32. ``scale`` is a static Python float (None:
K^-0.5). The FFI kernels need K == V, a multiple of 16 in [16, 256]; the naive kernels take any.

State pools (``chunk_kda(state_indices=...)``, ``fused_recurrent_kda``): sequence n reads and writes
``pool[indices[n]]``; a negative index is padding (zero output, no state touched). The pool is
updated in place: the call donates it (an eager call consumes the array passed in, under an outer
``jax.jit`` donate it there with ``donate_argnums``) and the returned pool is the same buffer. Use
the returned array. ``fused_recurrent_kda(inplace_final_state=False)`` leaves the input pool intact
and returns an updated copy.

Bad shapes or dtypes raise ValueError / TypeError naming the argument and what it must be, at trace
time: for the FFI kernels through the C++ call description (kda._core, its messages unchanged), for
the naive kernels through the checks they need themselves (kda.jax._args). ``cu_seqlens`` and index
values are checked when concrete; under ``jax.jit`` the FFI kernels check them at run time (an XLA
runtime error), the naive kernels do not. A concrete array on a GPU or
TPU passed to the FFI kernels is a ValueError (they are registered for the CPU only).
"""

from __future__ import annotations

import functools
import logging
import os

import jax

from . import _args, ffi, naive
from .naive import chunk_kda_jax_naive, fused_recurrent_kda_jax_naive

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


# --- jitted cores: statics as static arguments, the state donated when it is a pool -----------------


def _chunk_core(state, rest, *, statics, impl, output_final_state):
    spec = _args.Spec(*rest[:5], state, *rest[5:], *statics)
    if impl == "ffi":
        return ffi.chunk_spec(spec, output_final_state)
    return naive._chunk(spec, output_final_state)


def _recurrent_core(state, rest, *, statics, impl):
    spec = _args.Spec(*rest[:5], state, *rest[5:], *statics)
    if impl == "ffi":
        return ffi.recurrent_spec(spec)
    return naive._recurrent(spec)


_STATIC = ("statics", "impl", "output_final_state")
_chunk_jit = jax.jit(_chunk_core, static_argnames=_STATIC)
_chunk_jit_donating = jax.jit(_chunk_core, static_argnames=_STATIC, donate_argnums=0)
_recurrent_jit = jax.jit(_recurrent_core, static_argnames=("statics", "impl"))
_recurrent_jit_donating = jax.jit(_recurrent_core, static_argnames=("statics", "impl"), donate_argnums=0)


def _split(spec: _args.Spec):
    rest = (spec.q, spec.k, spec.v, spec.g, spec.beta, spec.cu_seqlens, spec.state_indices, spec.A_log,
            spec.dt_bias)
    statics = (spec.scale, spec.use_qk_l2norm_in_kernel, spec.use_gate_in_kernel, spec.N, spec.B, spec.T, spec.H,
               spec.K, spec.V)
    return spec.state, rest, statics


def _on_cpu(who: str, spec: _args.Spec, impl: str) -> None:
    if impl == "ffi":
        ffi.check_cpu(who, spec)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, cu_seqlens=None, A_log=None, dt_bias=None,
              state_indices=None, *, kernel: str | None = None):
    """Prefill: (o [B, T, H, V], final_state [N, H, K, V] or None).

    ``initial_state`` [N, H, K, V] fp32 (None: zeros); ``output_final_state`` returns the final states.
    ``use_qk_l2norm_in_kernel`` L2-normalises q and k over K; ``use_gate_in_kernel`` treats g as the raw
    gate, activated as -exp(A_log[h]) * softplus(g + dt_bias) with A_log [H] and dt_bias [H * K] (optional).
    With ``state_indices`` [N], ``initial_state`` is a pool [S, H, K, V]: sequence n starts from
    ``pool[state_indices[n]]`` and its final state is written there; the pool is donated and the updated
    pool is returned as the second result (whatever ``output_final_state`` says).
    """
    impl = backend(kernel)
    if impl == "ffi":  # the C++ call description's checks, at trace time
        ffi.check_chunk(q, k, v, g, beta, _args.static_scale("chunk_kda", scale), initial_state, output_final_state,
                        use_qk_l2norm_in_kernel, use_gate_in_kernel, cu_seqlens, A_log, dt_bias, state_indices)
    spec = _args.check_chunk(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                             cu_seqlens, A_log, dt_bias, state_indices)
    _on_cpu("chunk_kda", spec, impl)
    state, rest, statics = _split(spec)
    fn = _chunk_jit_donating if spec.state_indices is not None else _chunk_jit
    return fn(state, rest, statics=statics, impl=impl, output_final_state=bool(output_final_state))


def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True,
                        cu_seqlens=None, ssm_state_indices=None, use_qk_l2norm_in_kernel=False,
                        use_gate_in_kernel=False, A_log=None, dt_bias=None, *, kernel: str | None = None):
    """Decode (vLLM's semantics): (o [B, T, H, V], the state pool [S, H, K, V]).

    One token per sequence: q [N, 1, H, K], or [1, N, H, K] with ``cu_seqlens`` = 0, 1, ..., N. Sequence n
    updates ``initial_state[ssm_state_indices[n]]`` (None: ``initial_state[n]``; a negative index is
    padding). With ``inplace_final_state`` (the default) the pool is donated and updated in place;
    otherwise the input pool is left as it was and an updated copy is returned. ``initial_state`` None
    starts every sequence from zeros and returns their states [N, H, K, V].
    """
    impl = backend(kernel)
    if impl == "ffi":
        ffi.check_recurrent(q, k, v, g, beta, _args.static_scale("fused_recurrent_kda", scale), initial_state,
                            cu_seqlens, ssm_state_indices, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log,
                            dt_bias)
    spec = _args.check_recurrent(q, k, v, g, beta, scale, initial_state, cu_seqlens, ssm_state_indices,
                                 use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias)
    _on_cpu("fused_recurrent_kda", spec, impl)
    state, rest, statics = _split(spec)
    fn = _recurrent_jit_donating if inplace_final_state and state is not None else _recurrent_jit
    return fn(state, rest, statics=statics, impl=impl)


chunk_kda_ffi = functools.partial(chunk_kda, kernel="ffi")
chunk_kda_ffi.__doc__ = "chunk_kda on the XLA FFI kernels (RuntimeError when the library cannot load)."
fused_recurrent_kda_ffi = functools.partial(fused_recurrent_kda, kernel="ffi")
fused_recurrent_kda_ffi.__doc__ = "fused_recurrent_kda on the XLA FFI kernels."

if os.environ.get("KDA_JAX_KERNEL"):
    set_backend(os.environ["KDA_JAX_KERNEL"])

__all__ = [
    "KERNELS",
    "backend",
    "chunk_kda",
    "chunk_kda_ffi",
    "chunk_kda_jax_naive",
    "ffi_load_error",
    "fused_recurrent_kda",
    "fused_recurrent_kda_ffi",
    "fused_recurrent_kda_jax_naive",
    "get_backend_setting",
    "set_backend",
]
