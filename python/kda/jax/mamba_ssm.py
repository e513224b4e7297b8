"""Mamba2's SSD scan for JAX with mamba_ssm's names: ``mamba_chunk_scan_combined`` (prefill) and
``selective_state_update`` (a decode step), the semantics of :mod:`kda.mamba_ssm` (its checks, its
arithmetic around the scan, here in jax.numpy) on kda.jax's kernels: the delta-rule kernels without the
delta correction (``delta_correction=False``; k = B, q = C, v = x, beta = dt, g = dt A, scale 1, states
V-first [.., nheads, headdim, dstate]), the XLA FFI kernels or the pure-JAX naive ones (``kernel``: "auto",
"ffi" or "naive", as kda.jax's other entries).

JAX arrays are immutable: ``selective_state_update`` returns ``(out, new_state)``, the updated ``state``
(the pool with ``state_batch_indices``) in its own dtype. As ``fused_recurrent_kda_fwd``'s
``initial_state``, ``state`` is donated: an eager call consumes the array passed in and the kernel
updates its buffer, which the returned state is; under an outer ``jax.jit`` that donates it
(``donate_argnums``) the update is in place, otherwise XLA copies it first. Use the returned state.

Static under ``jax.jit``: the shapes and dtypes, ``chunk_size``, ``dt_softplus`` and ``dt_limit``.
``cu_seqlens`` may be traced (its shape gives the number of sequences; its values are checked when the
call runs, a ``jax.errors.JaxRuntimeError`` naming them); ``seq_idx``, whose values set the number of
sequences, must be concrete. The decode step runs one decay per head when dt, dt_bias and A are concrete
and tied along headdim (and A along dstate), as transformers expands them; traced, it runs one per channel
(the general form: the same recurrence, rounded differently).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import mamba_ssm as _ms
from . import _args

__all__ = ["mamba_chunk_scan_combined", "selective_state_update"]

_F32 = jnp.float32


def _arrays(who: str, **named) -> list:
    return [_args.as_array(who, name, x) for name, x in named.items()]


def _on_cpu(who: str, impl: str, **named) -> None:
    """The FFI kernels run on the CPU only: a concrete array elsewhere is a ValueError naming it."""
    if impl != "ffi":
        return
    from . import ffi

    for name, x in named.items():
        if isinstance(x, jax.Array) and _args.is_concrete(x):
            ffi.check_cpu_array(who, name, x)


def _f32(x):
    return None if x is None else x.astype(_F32)


def _sequences(who: str, b: int, seqlen: int, seq_idx, cu_seqlens):
    """The packed sequences as kda.mamba_ssm takes them (concrete values checked there), or a traced
    cu_seqlens itself (its shape checked; the kernels check its values when the call runs)."""
    if seq_idx is not None and not _args.is_concrete(seq_idx):
        raise ValueError(f"{who}: seq_idx: must be concrete (its values set the number of sequences, a static "
                         "shape); pass it as a constant, or the boundaries as cu_seqlens, which may be traced")
    if cu_seqlens is None or _args.is_concrete(cu_seqlens):
        return _ms.sequences(who, b, seqlen, seq_idx, cu_seqlens)
    if seq_idx is not None:
        raise ValueError(f"{who}: seq_idx: cannot be checked against a traced cu_seqlens; pass one of them")
    if not jnp.issubdtype(cu_seqlens.dtype, jnp.integer):
        raise TypeError(f"cu_seqlens: dtype must be an integer type, got {cu_seqlens.dtype}")
    _ms.check_cu_shape(who, b, cu_seqlens.shape)
    return cu_seqlens


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False, *, kernel=None):
    """mamba_ssm's ``mamba_chunk_scan_combined`` (as :func:`kda.mamba_ssm.mamba_chunk_scan_combined`): JAX
    arrays in, JAX arrays out; ``out``, ``(out, final_states)``, ``(out, varlen_states)`` or ``(out,
    final_states, varlen_states)``. ``kernel``: "auto" | "ffi" | "naive" (None: kda.jax's default)."""
    from . import _run, backend

    who = "mamba_chunk_scan_combined"
    x, dt, A, B, C, D, z, dt_bias, initial_states = _arrays(
        who, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    sc = _ms.check_scan(who, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, dt_limit, cu_seqlens,
                        return_varlen_states)
    b, seqlen, h, p, g, n = sc.b, sc.seqlen, sc.h, sc.p, sc.g, sc.n
    cu = _sequences(who, b, seqlen, seq_idx, cu_seqlens)
    impl = backend(kernel)
    _on_cpu(who, impl, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    step = _ms.step_size(jnp, dt.astype(_F32), _f32(dt_bias), bool(dt_softplus), sc.limit)
    x32 = x.astype(_F32)
    rows, tokens = (b, seqlen) if cu is None else (1, b * seqlen)
    state0 = None
    if initial_states is not None:
        state0 = _f32(initial_states)
        if cu is not None:
            state0 = _ms.first_states(jnp, jnp.asarray(cu), b, seqlen, state0)
    call = _args.check_chunk(
        C.astype(_F32).reshape(rows, tokens, g, n), B.astype(_F32).reshape(rows, tokens, g, n),
        x32.reshape(rows, tokens, h, p), (step * _f32(A)).reshape(rows, tokens, h), step.reshape(rows, tokens, h),
        1.0, state0, True, False, False, False, False, False, None, False, True, cu, None, None, _ms._KDA_CHUNK,
        None, None, delta_correction=False)
    o, final = _run(call, impl, who, donate_state=False)
    out = _ms.finish(jnp, o.reshape(b, seqlen, h, p), x32, _f32(D), _f32(z)).astype(x.dtype)
    results = [out]
    if return_final_states:
        results.append(final if cu is None else _ms.row_final_states(jnp, jnp.asarray(cu), b, seqlen, final))
    if return_varlen_states:
        results.append(final)
    return results[0] if len(results) == 1 else tuple(results)


def _decode(state, x, dt, A, B, C, D, z, dt_bias, idx, *, sp: _ms.Step, dt_softplus: bool, per_head: bool,
            impl: str):
    """A checked decode step (jitted, ``state`` donated): (out, the updated state)."""
    from . import _run

    bsz, h, p, g, n = sp.bsz, sp.h, sp.p, sp.g, sp.n
    step = _ms.step_size(jnp, dt.astype(_F32).reshape(bsz, h, p), None if dt_bias is None else
                         _f32(dt_bias).reshape(h, p), dt_softplus)
    hv, v, beta, gate = _ms.decode_gates(jnp, step, _f32(A).reshape(h, p, n), per_head)
    x32 = x.astype(_F32).reshape(bsz, h, p)
    call = _args.check_recurrent(
        C.astype(_F32).reshape(bsz, 1, g, n), B.astype(_F32).reshape(bsz, 1, g, n), x32.reshape(bsz, 1, hv, v),
        gate.reshape(bsz, 1, *gate.shape[1:]), beta.reshape(bsz, 1, hv), None, None, state.reshape(sp.rows, hv, v, n),
        1.0, False, True, True, None, idx, None, False, False, False, False, None, None, delta_correction=False)
    o, new = _run(call, impl, "selective_state_update", donate_state=True)
    y = _ms.finish(jnp, o.reshape(bsz, h, p), _ms.padded_out(jnp, idx, x32),
                   None if D is None else _f32(D).reshape(h, p), None if z is None else _f32(z).reshape(bsz, h, p))
    return y.astype(x.dtype).reshape(x.shape), new.reshape(state.shape)


@functools.lru_cache(maxsize=None)
def _decode_jitted():
    return jax.jit(_decode, static_argnames=("sp", "dt_softplus", "per_head", "impl"), donate_argnums=0)


def _tied(step, a) -> bool:
    """One decay per head: dt (after the bias and softplus) tied along headdim and A along headdim and dstate,
    known only when they are concrete (kda.mamba_ssm's rule)."""
    if not (_args.is_concrete(step) and _args.is_concrete(a)):
        return False
    return _ms._tied(np.asarray(step), (2,)) and _ms._tied(np.asarray(a), (1, 2))


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, *, kernel=None):
    """mamba_ssm's ``selective_state_update`` (as :func:`kda.mamba_ssm.selective_state_update`) on JAX
    arrays: returns ``(out, new_state)``, ``state`` donated (see the module). ``kernel``: "auto" | "ffi" |
    "naive" (None: kda.jax's default)."""
    from . import backend

    who = "selective_state_update"
    state, x, dt, A, B, C, D, z, dt_bias = _arrays(who, state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z,
                                                   dt_bias=dt_bias)
    sp = _ms.check_step(who, state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
    idx = state_batch_indices
    if idx is not None and _args.is_concrete(idx):
        idx = _ms.batch_indices(who, idx, sp.rows)
    elif idx is not None:
        if not jnp.issubdtype(idx.dtype, jnp.integer):
            raise TypeError(f"state_batch_indices: dtype must be an integer type, got {idx.dtype}")
        idx = idx.reshape(-1).astype(jnp.int32)
    if not isinstance(dt_softplus, (bool, np.bool_)):
        raise TypeError(f"{who}: dt_softplus must be a Python bool (static), got {type(dt_softplus).__name__}")
    impl = backend(kernel)
    _on_cpu(who, impl, state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)
    step = None
    if all(_args.is_concrete(v) for v in (dt, dt_bias) if v is not None):
        bias = None if dt_bias is None else _f32(dt_bias).reshape(sp.h, sp.p)
        step = _ms.step_size(jnp, dt.astype(_F32).reshape(sp.bsz, sp.h, sp.p), bias, bool(dt_softplus))
    per_head = step is not None and _tied(step, _f32(A).reshape(sp.h, sp.p, sp.n))
    return _decode_jitted()(state, x, dt, A, B, C, D, z, dt_bias, None if idx is None else jnp.asarray(idx), sp=sp,
                            dt_softplus=bool(dt_softplus), per_head=per_head, impl=impl)
