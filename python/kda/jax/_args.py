"""The naive kernels' own argument checks, and the arrays of a call as the jitted cores take them.

The FFI kernels are checked first by the C++ call description (kda/kernels/kda_args.h, through
kda._core; see ffi.check_chunk); these checks are what the naive kernels need for themselves.

Shapes and dtypes are checked when the call is traced (they are static under
``jax.jit``); ``cu_seqlens`` and the state indices are checked by value only
when they are concrete (an eager call). Under ``jax.jit`` their values are
checked by the FFI kernels at run time (an XLA runtime error naming the
problem); the naive kernels do not check them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
INT_DTYPES = (jnp.dtype(jnp.int32), jnp.dtype(jnp.int64))


def _shape_str(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _array(who: str, name: str, x):
    """x as a JAX array (numpy arrays and lists are converted), or TypeError."""
    if isinstance(x, jax.Array):
        return x
    if isinstance(x, (np.ndarray, list, tuple, np.generic, float, int)):
        return jnp.asarray(x)
    raise TypeError(f"{who}: {name} must be an array, got {type(x).__name__}")


def _check_float(who: str, name: str, x, allowed=FLOAT_DTYPES) -> None:
    if jnp.dtype(x.dtype) not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{who}: {name} must be {names}, got {x.dtype}")


def _check_shape(who: str, name: str, x, want: tuple, what: str) -> None:
    if tuple(x.shape) != tuple(want):
        raise ValueError(f"{who}: {name} must be {what} = {_shape_str(want)}, got {_shape_str(x.shape)}")


def is_concrete(x) -> bool:
    return x is not None and not isinstance(x, jax.core.Tracer)


@dataclass
class Spec:
    """A checked call: the arrays (int indices as int32, A_log/dt_bias as fp32) and the static facts."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    g: jax.Array
    beta: jax.Array
    state: jax.Array | None  # initial states [N,H,K,V] or the pool [S,H,K,V]
    cu_seqlens: jax.Array | None  # int32 [N+1]
    state_indices: jax.Array | None  # int32 [N]
    A_log: jax.Array | None  # fp32 [H]
    dt_bias: jax.Array | None  # fp32 [H*K]
    scale: float
    use_qk_l2norm_in_kernel: bool
    use_gate_in_kernel: bool
    N: int
    B: int
    T: int
    H: int
    K: int
    V: int

    def arrays(self) -> list:
        return [self.q, self.k, self.v, self.g, self.beta, self.state, self.cu_seqlens, self.state_indices,
                self.A_log, self.dt_bias]


def static_scale(who: str, scale) -> float | None:
    """``scale`` as the static Python float it must be (None stays None: K^-0.5)."""
    if scale is None:
        return None
    if isinstance(scale, (jax.Array, np.ndarray)) and scale.ndim == 0 and is_concrete(scale):
        scale = float(scale)
    if isinstance(scale, bool) or not isinstance(scale, (float, int, np.floating, np.integer)):
        raise TypeError(f"{who}: scale must be a Python float (static) or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{who}: scale must be a finite positive float or None (K^-0.5), got {scale}")
    return scale


def _common(who, q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias):
    q = _array(who, "q", q)
    k = _array(who, "k", k)
    v = _array(who, "v", v)
    g = _array(who, "g", g)
    beta = _array(who, "beta", beta)
    if q.ndim != 4:
        raise ValueError(f"{who}: q must be [B, T, H, K], got {_shape_str(q.shape)}")
    B, T, H, K = (int(d) for d in q.shape)
    _check_float(who, "q", q)
    _check_shape(who, "k", k, (B, T, H, K), "[B, T, H, K]")
    if k.dtype != q.dtype:
        raise TypeError(f"{who}: k must have q's dtype {q.dtype}, got {k.dtype}")
    if v.ndim != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"{who}: v must be [B, T, H, V] = [{B}, {T}, {H}, V], got {_shape_str(v.shape)}")
    V = int(v.shape[3])
    if v.dtype != q.dtype:
        raise TypeError(f"{who}: v must have q's dtype {q.dtype}, got {v.dtype}")
    _check_shape(who, "g", g, (B, T, H, K), "[B, T, H, K]")
    _check_float(who, "g", g)
    _check_shape(who, "beta", beta, (B, T, H), "[B, T, H]")
    _check_float(who, "beta", beta)
    scale = static_scale(who, scale)
    scale = K**-0.5 if scale is None else scale
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError(f"{who}: use_gate_in_kernel=True requires A_log [H] = [{H}]")
        A_log = _array(who, "A_log", A_log)
        _check_float(who, "A_log", A_log)
        if A_log.size != H or A_log.ndim not in (1, 4):
            raise ValueError(f"{who}: A_log must be [H] = [{H}] (or [1, 1, H, 1]), got {_shape_str(A_log.shape)}")
        A_log = A_log.reshape(H).astype(jnp.float32)
        if dt_bias is not None:
            dt_bias = _array(who, "dt_bias", dt_bias)
            _check_float(who, "dt_bias", dt_bias)
            if tuple(dt_bias.shape) not in ((H * K,), (H, K)):
                raise ValueError(f"{who}: dt_bias must be [H * K] = [{H * K}] (or [H, K]), "
                                 f"got {_shape_str(dt_bias.shape)}")
            dt_bias = dt_bias.reshape(H * K).astype(jnp.float32)
    else:
        A_log = None  # as fla: A_log and dt_bias only matter with the gate in the kernel
        dt_bias = None
    return dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, scale=float(scale),
                use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), use_gate_in_kernel=bool(use_gate_in_kernel),
                B=B, T=T, H=H, K=K, V=V)


def _int_array(who: str, name: str, x, want_len: int | None, what: str):
    x = _array(who, name, x)
    if jnp.dtype(x.dtype) not in INT_DTYPES:
        raise TypeError(f"{who}: {name} must be int32 or int64, got {x.dtype}")
    if x.ndim != 1 or (want_len is not None and x.shape[0] != want_len):
        raise ValueError(f"{who}: {name} must be {what}, got {_shape_str(x.shape)}")
    if is_concrete(x) and x.size and jnp.dtype(x.dtype) == jnp.int64:
        a = np.asarray(x)
        if a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min:
            raise ValueError(f"{who}: {name} values must fit in int32")
    return x.astype(jnp.int32)


def _check_cu_values(who: str, cu, total: int) -> None:
    if not is_concrete(cu):
        return
    c = np.asarray(cu)
    if c[0] != 0:
        raise ValueError(f"{who}: cu_seqlens[0] must be 0, got {c[0]}")
    d = np.diff(c)
    if (d < 0).any():
        n = int(np.argmax(d < 0)) + 1
        raise ValueError(f"{who}: cu_seqlens must be non-decreasing, but cu_seqlens[{n}] = {c[n]} < "
                         f"cu_seqlens[{n - 1}] = {c[n - 1]}")
    if c[-1] != total:
        raise ValueError(f"{who}: cu_seqlens[-1] must equal the number of tokens {total}, got {c[-1]}")


def _check_index_values(who: str, name: str, idx, num_states: int) -> None:
    if not is_concrete(idx):
        return
    a = np.asarray(idx)
    bad = a >= num_states
    if bad.any():
        n = int(np.argmax(bad))
        raise ValueError(f"{who}: {name}[{n}] = {a[n]} is out of range for a pool of {num_states} states "
                         "(a negative index marks padding)")
    used = a[a >= 0]
    u, counts = np.unique(used, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{who}: {name} holds state {u[np.argmax(counts > 1)]} twice")


def check_state(who: str, name: str, x, want: tuple, what: str):
    x = _array(who, name, x)
    if jnp.dtype(x.dtype) != jnp.float32:
        raise TypeError(f"{who}: {name} must be float32, got {x.dtype}")
    if x.ndim != 4 or (want[0] is not None and x.shape[0] != want[0]) or tuple(x.shape[1:]) != tuple(want[1:]):
        w = _shape_str(["S" if d is None else d for d in want])
        raise ValueError(f"{who}: {name} must be {what} = {w}, got {_shape_str(x.shape)}")
    return x


def _packed_cu_seqlens(who: str, q, cu_seqlens, want_len: int | None, what: str):
    """cu_seqlens of a packed batch (B = 1) as int32 [N + 1]."""
    if q.shape[0] != 1:
        raise ValueError(f"{who}: with cu_seqlens the batch must be packed, B = 1, got q {_shape_str(q.shape)}")
    return _int_array(who, "cu_seqlens", cu_seqlens, want_len, what)


def _pool_and_indices(who: str, name: str, initial_state, indices, N: int, H: int, K: int, V: int):
    """The state pool [S, H, K, V] and its [N] indices (checked by value when concrete)."""
    if initial_state is None:
        raise ValueError(f"{who}: {name} needs initial_state, the state pool [S, H, K, V] = [S, {H}, {K}, {V}]")
    pool = check_state(who, "initial_state", initial_state, (None, H, K, V), "the state pool [S, H, K, V]")
    indices = _int_array(who, name, indices, N, f"[N] = [{N}]")
    _check_index_values(who, name, indices, pool.shape[0])
    return pool, indices


def check_chunk(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, cu_seqlens,
                A_log, dt_bias, state_indices, who: str = "chunk_kda") -> Spec:
    c = _common(who, q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias)
    B, T, H, K, V = c["B"], c["T"], c["H"], c["K"], c["V"]
    if cu_seqlens is not None:
        cu_seqlens = _packed_cu_seqlens(who, c["q"], cu_seqlens, None, "[N + 1] with N >= 1")
        if cu_seqlens.shape[0] < 2:
            raise ValueError(f"{who}: cu_seqlens must be [N + 1] with N >= 1, got {_shape_str(cu_seqlens.shape)}")
        _check_cu_values(who, cu_seqlens, T)
        N = cu_seqlens.shape[0] - 1
    else:
        if B < 1:
            raise ValueError(f"{who}: q must have B >= 1 sequences, got {_shape_str(c['q'].shape)}")
        N = B
    if state_indices is not None:
        state, state_indices = _pool_and_indices(who, "state_indices", initial_state, state_indices, N, H, K, V)
    elif initial_state is not None:
        state = check_state(who, "initial_state", initial_state, (N, H, K, V), "[N, H, K, V]")
    else:
        state = None
    return Spec(**c, state=state, cu_seqlens=cu_seqlens, state_indices=state_indices, N=N)


def check_recurrent(q, k, v, g, beta, scale, initial_state, cu_seqlens, ssm_state_indices, use_qk_l2norm_in_kernel,
                    use_gate_in_kernel, A_log, dt_bias, who: str = "fused_recurrent_kda") -> Spec:
    c = _common(who, q, k, v, g, beta, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias)
    B, T, H, K, V = c["B"], c["T"], c["H"], c["K"], c["V"]
    if cu_seqlens is not None:
        cu_seqlens = _packed_cu_seqlens(who, c["q"], cu_seqlens, T + 1,
                                        f"[N + 1] = [{T + 1}] (decode: one token per sequence)")
        if is_concrete(cu_seqlens) and not np.array_equal(np.asarray(cu_seqlens), np.arange(T + 1)):
            raise ValueError(f"{who}: decode takes one token per sequence: cu_seqlens must be 0, 1, ..., {T}, "
                             f"got {np.asarray(cu_seqlens).tolist()}")
        N = T
    else:
        if T != 1:
            raise ValueError(f"{who}: decode takes one token per sequence: q must be [N, 1, H, K] (or [1, N, H, K] "
                             f"with cu_seqlens), got {_shape_str(c['q'].shape)}")
        N = B
    if ssm_state_indices is not None:
        state, ssm_state_indices = _pool_and_indices(who, "ssm_state_indices", initial_state, ssm_state_indices, N, H,
                                                     K, V)
    elif initial_state is not None:
        state = check_state(who, "initial_state", initial_state, (None, H, K, V), "the state pool [S, H, K, V]")
        if state.shape[0] < N:
            raise ValueError(f"{who}: without ssm_state_indices sequence n uses initial_state[n]: the pool needs "
                             f">= N = {N} states, got {_shape_str(state.shape)}")
    else:
        state = None
    return Spec(**c, state=state, cu_seqlens=cu_seqlens, state_indices=ssm_state_indices, N=N)
