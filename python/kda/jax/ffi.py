"""The KDA and Gated DeltaNet kernels as XLA FFI custom calls on the CPU platform.

The C++ handlers (python/xla_ffi/kda_xla_ffi.cc) live in the shared library
``libkda_xla_ffi.so``, found at ``$KDA_XLA_FFI_LIBRARY`` when that is set (for
development: e.g. ``build/python/xla_ffi/libkda_xla_ffi.so``), else next to the
installed package (``kda/libkda_xla_ffi.so``). :func:`load` opens it with ctypes
and registers its four targets with ``jax.ffi.register_ffi_target``:

- ``kda_chunk_kda`` (symbol ``KdaChunkKda``),
- ``kda_fused_recurrent_kda`` (symbol ``KdaFusedRecurrentKda``),
- ``kda_chunk_gated_delta_rule`` (symbol ``KdaChunkGatedDeltaRule``),
- ``kda_fused_recurrent_gated_delta_rule`` (symbol ``KdaFusedRecurrentGatedDeltaRule``).

The Gated DeltaNet targets are the KDA ones with the entry's name in their errors
(and chunk_gated_delta_rule's rules: g [B, T, HV] only, chunk_size 16, 32 or 64);
both take g [B, T, HV, K] (a decay per key dimension) or [B, T, HV] (a scalar
per value head), the width read from g's rank.

Calling convention (see the C++ file for the full list): the token operands go
as they are ([B, T, H, K] etc., float32, bfloat16 or float16); ``cu_seqlens``,
the state indices and ``num_accepted_tokens`` as int32 buffers (int64 inputs
are cast; JAX's default integer type, so no x64 mode is needed); absent
optional operands as empty [0] buffers; scale, lower_bound, chunk_size and the
flags as FFI attributes. A state buffer updated in place (chunk_kda's pool,
fused_recurrent_kda_fwd's initial_state with inplace_final_state) is the call's
second result, aliased to its input through ``input_output_aliases``, and so
is ``out`` to o: under ``jax.jit`` with them donated the kernel updates them in
place, otherwise XLA copies them first.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .. import _kernels
from . import _args

LIBRARY_NAME = "libkda_xla_ffi.so"
ENV_LIBRARY = "KDA_XLA_FFI_LIBRARY"
CHUNK_TARGET = "kda_chunk_kda"
RECURRENT_TARGET = "kda_fused_recurrent_kda"
GDN_CHUNK_TARGET = "kda_chunk_gated_delta_rule"
GDN_RECURRENT_TARGET = "kda_fused_recurrent_gated_delta_rule"
# The targets of each entry (the core's ``entry``): (chunk, recurrent); and (target, symbol) to register.
TARGETS = {"kda": (CHUNK_TARGET, RECURRENT_TARGET), "gated_delta_rule": (GDN_CHUNK_TARGET, GDN_RECURRENT_TARGET)}
_SYMBOLS = ((CHUNK_TARGET, "KdaChunkKda"), (RECURRENT_TARGET, "KdaFusedRecurrentKda"),
            (GDN_CHUNK_TARGET, "KdaChunkGatedDeltaRule"), (GDN_RECURRENT_TARGET, "KdaFusedRecurrentGatedDeltaRule"))

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
            for target, symbol in _SYMBOLS:
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
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


def check_cpu(who: str, call: _args.Call) -> None:
    """A concrete array on a non-CPU device is refused: the handlers are registered for the CPU only."""
    for name, x in call.named_arrays():
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


def _opt(x, dtype):
    """An optional operand: absent as an empty [0] buffer."""
    return jnp.zeros((0,), dtype) if x is None else x


def _attributes(st: _args.Statics) -> dict:
    """The options both targets take (optional floats as a flag and a value)."""
    return dict(has_scale=st.scale is not None, scale=np.float32(st.scale or 0.0),
                use_qk_l2norm_in_kernel=st.use_qk_l2norm_in_kernel, use_gate_in_kernel=st.use_gate_in_kernel,
                use_beta_sigmoid_in_kernel=st.use_beta_sigmoid_in_kernel, allow_neg_eigval=st.allow_neg_eigval,
                has_lower_bound=st.lower_bound is not None, lower_bound=np.float32(st.lower_bound or 0.0),
                state_v_first=st.state_v_first, delta_correction=st.delta_correction,
                output_final_state=st.output_final_state)


def _o_dtype(c: _args.Call):
    """fla's dtype of o: q's for the chunk entries, v's for the recurrent ones."""
    return c.q.dtype if c.st.kind == "chunk" else c.v.dtype


def _o_type(c: _args.Call):
    st = c.st
    return jax.ShapeDtypeStruct((st.B, st.T, st.HV, st.V), _o_dtype(c))


def chunk(c: _args.Call):
    """The chunk target on a checked call: (o, final state or the pool or None[, intermediate states])."""
    _require(_kernels.CHUNK_NAMES[c.st.entry])
    st = c.st
    pool = c.indices is not None
    aliases = None
    if pool:
        s_type = jax.ShapeDtypeStruct(c.state.shape, jnp.float32)
        aliases = {6: 1}
    elif st.output_final_state:
        s_type = jax.ShapeDtypeStruct((st.N, st.HV, *st.state_dims), jnp.float32)
    else:
        s_type = jax.ShapeDtypeStruct((0,), jnp.float32)
    inter = st.return_intermediate_states
    h_type = jax.ShapeDtypeStruct((st.B, st.num_chunks, st.HV, *st.state_dims) if inter else (0,), c.k.dtype)
    call = jax.ffi.ffi_call(TARGETS[st.entry][0], (_o_type(c), s_type, h_type), input_output_aliases=aliases)
    o, s, h = call(c.q, c.k, c.v, c.g, c.beta, _opt(c.cu_seqlens, jnp.int32), _opt(c.state, jnp.float32),
                   _opt(c.indices, jnp.int32), _opt(c.A_log, jnp.float32), _opt(c.dt_bias, jnp.float32),
                   **_attributes(st), safe_gate=st.safe_gate, chunk_size=np.int32(st.chunk_size), pool=pool,
                   return_intermediate_states=inter)
    final = s if pool or st.output_final_state else None
    return (o, final, h) if inter else (o, final)


def recurrent(c: _args.Call):
    """The recurrent target on a checked call: (o, the updated initial_state, or the new states, or None)."""
    _require(_kernels.RECURRENT_NAMES[c.st.entry])
    st = c.st
    aliases = {} if c.out is None else {11: 0}
    if st.inplace_final_state:  # the states written back in the pool's own dtype (fp32, fp16 or bf16)
        s_type = jax.ShapeDtypeStruct(c.state.shape, c.state.dtype)
        aliases[5] = 1
    elif st.output_final_state:
        rows = st.B * st.T if c.indices is not None else st.N  # with indices: the state after every token
        s_type = jax.ShapeDtypeStruct((rows, st.HV, *st.state_dims), jnp.float32)
    else:
        s_type = jax.ShapeDtypeStruct((0,), jnp.float32)
    call = jax.ffi.ffi_call(TARGETS[st.entry][1], (_o_type(c), s_type), input_output_aliases=aliases or None)
    o, s = call(c.q, c.k, c.v, c.g, c.beta, _opt(c.state, jnp.float32), _opt(c.indices, jnp.int32),
                _opt(c.num_accepted_tokens, jnp.int32), _opt(c.cu_seqlens, jnp.int32), _opt(c.A_log, jnp.float32),
                _opt(c.dt_bias, jnp.float32), _opt(c.out, _o_dtype(c)), **_attributes(st),
                inplace_final_state=st.inplace_final_state)
    return o, (s if st.inplace_final_state or st.output_final_state else None)


def run(c: _args.Call):
    """A checked call on the FFI kernels (as naive.run)."""
    return chunk(c) if c.st.kind == "chunk" else recurrent(c)
