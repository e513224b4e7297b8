"""The KDA kernels as XLA FFI custom calls on the CPU platform.

The C++ handlers (python/xla_ffi/kda_xla_ffi.cc) live in the shared library
``libkda_xla_ffi.so``, found at ``$KDA_XLA_FFI_LIBRARY`` when that is set (for
development: e.g. ``build/python/xla_ffi/libkda_xla_ffi.so``), else next to the
installed package (``kda/libkda_xla_ffi.so``). :func:`load` opens it with ctypes
and registers its two targets with ``jax.ffi.register_ffi_target``:

- ``kda_chunk_kda`` (symbol ``KdaChunkKda``),
- ``kda_fused_recurrent_kda`` (symbol ``KdaFusedRecurrentKda``).

Calling convention (see the C++ file for the full list): the token operands go
as they are ([B, T, H, K] etc., fp32 or bf16); ``cu_seqlens`` and the state
indices as int32 buffers (int64 inputs are cast; JAX's default integer type,
so no x64 mode is needed); absent optional operands (initial state, indices,
A_log, dt_bias) as empty [0] buffers; scale and the flags as FFI attributes.
The state pool is the call's second result, aliased to its input through
``input_output_aliases``: under ``jax.jit`` with the pool donated the kernel
updates it in place, otherwise XLA copies it first.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import _args

LIBRARY_NAME = "libkda_xla_ffi.so"
ENV_LIBRARY = "KDA_XLA_FFI_LIBRARY"
CHUNK_TARGET = "kda_chunk_kda"
RECURRENT_TARGET = "kda_fused_recurrent_kda"

_state = {"loaded": False, "tried": False, "error": None, "path": None, "lib": None}


def _candidates() -> list[Path]:
    env = os.environ.get(ENV_LIBRARY)
    if env:
        return [Path(env)]
    # kda/jax/ffi.py -> kda/; every directory of the package when kda is a namespace package.
    dirs = [Path(__file__).resolve().parent.parent]
    try:
        import kda

        dirs += [Path(p) for p in getattr(kda, "__path__", [])]
    except ImportError:  # pragma: no cover - kda.jax imported without its parent on the path
        pass
    seen, out = set(), []
    for d in dirs:
        p = d / LIBRARY_NAME
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def load() -> bool:
    """Loads the library and registers the targets (once per process). True when they are usable."""
    if _state["tried"]:
        return _state["loaded"]
    _state["tried"] = True
    errors = []
    for path in _candidates():
        if not path.exists():
            errors.append(f"{path}: no such file")
            continue
        try:
            lib = ctypes.CDLL(str(path))
            jax.ffi.register_ffi_target(CHUNK_TARGET, jax.ffi.pycapsule(lib.KdaChunkKda), platform="cpu")
            jax.ffi.register_ffi_target(RECURRENT_TARGET, jax.ffi.pycapsule(lib.KdaFusedRecurrentKda),
                                        platform="cpu")
        except (OSError, AttributeError, RuntimeError, ValueError) as e:
            errors.append(f"{path}: {e}")
            continue
        _state.update(loaded=True, error=None, path=str(path), lib=lib)
        return True
    where = f"${ENV_LIBRARY}" if os.environ.get(ENV_LIBRARY) else "the kda package directory"
    _state["error"] = f"cannot load {LIBRARY_NAME} from {where}: " + "; ".join(errors)
    return False


def available() -> bool:
    return load()


def load_error() -> str | None:
    """Why the library did not load (None when it did, or before the first attempt)."""
    load()
    return _state["error"]


def library_path() -> str | None:
    """The path of the loaded library, or None."""
    load()
    return _state["path"]


def _spec(x, cast=None):
    """An argument for the core's shape check: None, the concrete values of a small index array (checked by
    value), or (dtype, shape) of anything else; ``cast``: the dtype the call will cast it to."""
    if x is None:
        return None
    x = x if isinstance(x, jax.Array) else jnp.asarray(x)
    dt = jnp.dtype(x.dtype)
    if cast is not None:
        kind = jnp.floating if jnp.issubdtype(cast, jnp.floating) else jnp.integer
        if jnp.issubdtype(dt, kind):
            dt = jnp.dtype(cast)
    return (dt.name, tuple(int(d) for d in x.shape))


def _index_spec(x):
    """An index argument: its values when concrete (int32, as the FFI takes them), else its spec."""
    if x is None or not _args.is_concrete(x):
        return _spec(x, jnp.int32)
    a = np.asarray(x)
    if a.dtype.kind in "iu" and a.size and (a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
        return a  # the core names the dtype; the cast would wrap
    return a.astype(np.int32) if a.dtype.kind in "iu" else a


def _core():
    from .. import _core

    return _core


def check_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                use_gate_in_kernel, cu_seqlens, A_log, dt_bias, state_indices) -> dict:
    """The C++ call description's shape check of a chunk_kda call (kda/kernels/kda_args.h), at trace time;
    its errors surface unchanged. Returns the sizes the call implies."""
    pool = state_indices is not None
    gate = bool(use_gate_in_kernel)
    return _core().chunk_kda(
        o=None, final_state=None, q=_spec(q), k=_spec(k), v=_spec(v), g=_spec(g), beta=_spec(beta),
        scale=scale, initial_state=None if pool else _spec(initial_state), output_final_state=bool(output_final_state),
        use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), use_gate_in_kernel=gate,
        cu_seqlens=_index_spec(cu_seqlens), A_log=_spec(A_log, jnp.float32) if gate else None,
        dt_bias=_spec(dt_bias, jnp.float32) if gate else None, state=_spec(initial_state) if pool else None,
        state_indices=_index_spec(state_indices), check_only=True)


def check_recurrent(q, k, v, g, beta, scale, initial_state, cu_seqlens, ssm_state_indices, use_qk_l2norm_in_kernel,
                    use_gate_in_kernel, A_log, dt_bias) -> dict:
    """As check_chunk, for fused_recurrent_kda (None indices: sequence n uses initial_state[n], as the
    handler is called)."""
    gate = bool(use_gate_in_kernel)
    args = dict(o=None, final_state=None, q=_spec(q), k=_spec(k), v=_spec(v), g=_spec(g), beta=_spec(beta),
                scale=scale, initial_state=_spec(initial_state), cu_seqlens=_index_spec(cu_seqlens),
                use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), use_gate_in_kernel=gate,
                A_log=_spec(A_log, jnp.float32) if gate else None,
                dt_bias=_spec(dt_bias, jnp.float32) if gate else None, check_only=True)
    idx = ssm_state_indices
    if idx is None and initial_state is not None:
        n = (len(cu_seqlens) - 1) if cu_seqlens is not None else int(np.shape(q)[0])
        idx = np.arange(max(n, 0), dtype=np.int32)
    return _core().fused_recurrent_kda(ssm_state_indices=_index_spec(idx), **args)


def check_cpu(who: str, spec: _args.Spec) -> None:
    """A concrete array on a non-CPU device is refused: the handlers are registered for the CPU only."""
    names = ["q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "state_indices", "A_log", "dt_bias"]
    for name, x in zip(names, spec.arrays()):
        if x is None or not _args.is_concrete(x) or not isinstance(x, jax.Array):
            continue
        check_cpu_array(who, name, x)


def check_cpu_array(who: str, name: str, x) -> None:
    platforms = sorted({d.platform for d in x.devices()})
    if platforms != ["cpu"]:
        raise ValueError(f"{who}: {name} lives on {', '.join(platforms)}; the kda FFI kernels run on the CPU only "
                         f"(move it with jax.device_put(x, jax.devices('cpu')[0]), or use kernel='naive')")


def _require(who: str) -> None:
    if not load():
        raise RuntimeError(f"{who}: the kda XLA FFI kernels are not available: {_state['error']}")


def _empty(dtype):
    return jnp.zeros((0,), dtype)


def _opt(x, dtype):
    return _empty(dtype) if x is None else x


def chunk_spec(spec: _args.Spec, output_final_state: bool):
    """Runs the chunk target on a checked call; (o, final state or pool or None)."""
    _require("chunk_kda")
    N, H, K, V = spec.N, spec.H, spec.K, spec.V
    pool = spec.state_indices is not None
    o_type = jax.ShapeDtypeStruct(spec.q.shape[:3] + (V,), spec.q.dtype)
    aliases = None
    if pool:
        s_type = jax.ShapeDtypeStruct(spec.state.shape, jnp.float32)
        aliases = {6: 1}
    elif output_final_state:
        s_type = jax.ShapeDtypeStruct((N, H, K, V), jnp.float32)
    else:
        s_type = jax.ShapeDtypeStruct((0,), jnp.float32)
    call = jax.ffi.ffi_call(CHUNK_TARGET, (o_type, s_type), input_output_aliases=aliases)
    o, s = call(spec.q, spec.k, spec.v, spec.g, spec.beta, _opt(spec.cu_seqlens, jnp.int32), _opt(spec.state, jnp.float32),
                _opt(spec.state_indices, jnp.int32), _opt(spec.A_log, jnp.float32), _opt(spec.dt_bias, jnp.float32),
                scale=np.float32(spec.scale), use_qk_l2norm_in_kernel=spec.use_qk_l2norm_in_kernel,
                use_gate_in_kernel=spec.use_gate_in_kernel, output_final_state=bool(output_final_state), pool=pool)
    if pool or output_final_state:
        return o, s
    return o, None


def recurrent_spec(spec: _args.Spec):
    """Runs the decode target on a checked call; (o, the updated pool)."""
    _require("fused_recurrent_kda")
    N, H, K, V = spec.N, spec.H, spec.K, spec.V
    state = spec.state if spec.state is not None else jnp.zeros((N, H, K, V), jnp.float32)
    idx = spec.state_indices if spec.state_indices is not None else jnp.arange(N, dtype=jnp.int32)
    o_type = jax.ShapeDtypeStruct(spec.q.shape[:3] + (V,), spec.q.dtype)
    s_type = jax.ShapeDtypeStruct(state.shape, jnp.float32)
    call = jax.ffi.ffi_call(RECURRENT_TARGET, (o_type, s_type), input_output_aliases={5: 1})
    return call(spec.q, spec.k, spec.v, spec.g, spec.beta, state, idx, _opt(spec.cu_seqlens, jnp.int32),
                _opt(spec.A_log, jnp.float32), _opt(spec.dt_bias, jnp.float32), scale=np.float32(spec.scale),
                use_qk_l2norm_in_kernel=spec.use_qk_l2norm_in_kernel, use_gate_in_kernel=spec.use_gate_in_kernel)
