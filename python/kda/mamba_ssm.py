"""Mamba2's SSD scan with mamba_ssm's signatures over numpy and torch CPU arrays: ``mamba_chunk_scan_combined``
(prefill) and ``selective_state_update`` (a decode step), the names engines and transformers call.

Both run kda's delta-rule kernels without the delta correction (``delta_correction=False``: the state
update is ``S <- exp(dt A) S + dt x B^T``, the output ``y = S C``) with k = B, q = C, v = x, beta = dt,
g = dt A, scale 1, the G groups of B and C as key heads and the states V-first, so mamba_ssm's state
layout ``[batch, nheads, headdim, dstate]`` (transformers' cache) is the kernels' own. What stays here
is mamba_ssm's arithmetic around the scan, in float32: ``dt + dt_bias``, ``softplus`` (``x`` above 20,
as torch), the ``dt_limit`` clamp (the chunked entry only, as mamba_ssm), ``y + D x`` and the gate
``y * silu(z)``; the result is rounded once to x's dtype. x, B, C and z may be float32, bfloat16 or
float16 (read as float32: exact), the states float32 (``selective_state_update`` also takes a
bfloat16 or float16 state, updated in fp32 and rounded back).

Every argument is checked, with mamba_ssm's name in the error, before anything is written. Torch
tensors that require grad are refused under grad mode (kda is forward-only). docs/fla-api.md
("mamba_ssm's names") lists the semantics and where kda differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _core
from ._arrays import BF16, for_core_writable, int_array, is_torch, np_dtype, param_f32, shape_of
from ._kernels import _check_grad, _np_f32

__all__ = ["mamba_chunk_scan_combined", "selective_state_update"]

_FLOATS = ("float32", "bfloat16", "float16")
_MAX_DIM = 256  # kda's bound on headdim and dstate
_KDA_CHUNK = 64  # the chunk kda's prefill runs (mamba_ssm's chunk_size does not change the result)


def _float_array(who: str, name: str, x, shape: tuple | None = None, text: str = "") -> tuple:
    """A float token array's shape, checked: float32, bfloat16 or float16, and ``shape`` when given."""
    s = shape_of(x, f"{who}: {name}")
    dt = np_dtype(x)
    if dt is None or dt.name not in _FLOATS:
        raise TypeError(f"{who}: {name}: dtype must be float32, bfloat16 or float16, got {x.dtype}")
    if shape is not None and s != tuple(shape):
        raise ValueError(f"{who}: {name}: expected shape {text} = {list(shape)}, got {list(s)}")
    return s


def _param_shape(who: str, name: str, x, shapes: list[tuple], text: str) -> tuple | None:
    """A small float parameter's (A, D, dt_bias) shape, one of ``shapes``, and its float dtype checked."""
    if x is None:
        return None
    s = shape_of(x, f"{who}: {name}")
    if s not in shapes:
        raise ValueError(f"{who}: {name}: expected shape {text}, got {list(s)}")
    dt = np_dtype(x)
    if dt is None or (dt.kind != "f" and dt != BF16):
        raise TypeError(f"{who}: {name}: dtype must be a float type, got {x.dtype}")
    return s


def _f32(x) -> np.ndarray | None:
    """A checked parameter as float32 numpy (None stays None)."""
    return None if x is None else param_f32(x, "")


def _dt_limit(who: str, dt_limit) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in dt_limit)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: dt_limit: expected (min, max), got {dt_limit!r}") from None
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"{who}: dt_limit: expected min <= max, got {(lo, hi)}")
    return lo, hi


def softplus(xp, x):
    """softplus(x) = log(1 + e^x), x itself above 20 (torch's threshold), in ``xp`` (numpy or jax.numpy)."""
    return xp.where(x > 20.0, x, xp.log1p(xp.exp(xp.minimum(x, 20.0))))


def step_size(xp, dt, dt_bias, dt_softplus: bool, limit: tuple | None = None):
    """mamba_ssm's step size in float32: dt + dt_bias, softplus with ``dt_softplus``, then the clamp to
    ``limit`` (min, max) when given (the chunked entry's dt_limit; the decode step has none)."""
    if dt_bias is not None:
        dt = dt + dt_bias
    dt = (softplus(xp, dt) if dt_softplus else dt).astype(xp.float32)
    return dt if limit is None else xp.clip(dt, *limit).astype(xp.float32)


def finish(xp, y, x32, D, z32):
    """y + D x (D [nheads] or [nheads, headdim]), times silu(z) when z is given: float32 in ``xp``."""
    if D is not None:
        y = y + (D[:, None] if D.ndim == 1 else D) * x32
    if z32 is not None:
        y = y * (z32 / (xp.float32(1.0) + xp.exp(-z32)))
    return y.astype(xp.float32)


def first_states(xp, cu, b: int, seqlen: int, init):
    """Each packed sequence's initial state: a row's first sequence (the first one at its start, b rows of
    seqlen tokens packed row after row) starts from the row's ``init`` [b, ...], the others from zeros."""
    starts, rows = cu[:-1], max(seqlen, 1)
    row = xp.minimum(starts // rows, b - 1)
    first = xp.concatenate([xp.ones(1, bool), starts[1:] != starts[:-1]])
    at_row = (starts % rows == 0) & (starts < b * seqlen) & first
    return xp.where(at_row.reshape(-1, *(1,) * (init.ndim - 1)), init[row], xp.float32(0.0)).astype(xp.float32)


def row_final_states(xp, cu, b: int, seqlen: int, final):
    """Each row's final state: its last packed sequence's (the first to end at the row's end)."""
    return final[xp.searchsorted(cu[1:], (xp.arange(b) + 1) * seqlen, side="left")]


def _framework(a: np.ndarray, like, dtype: np.dtype):
    """A float32 numpy result as ``like``'s framework in ``dtype`` (rounded to nearest even)."""
    if is_torch(like):
        import torch

        t = torch.from_numpy(np.ascontiguousarray(a))
        return t.to(getattr(torch, dtype.name)) if dtype != np.float32 else t
    return a if dtype == np.float32 else a.astype(dtype)


def check_cu_shape(who: str, b: int, shape: tuple) -> None:
    """cu_seqlens' shape, [N + 1] with N >= 1, and the batch 1 it needs."""
    if len(shape) != 1 or shape[0] < 2:
        raise ValueError(f"{who}: cu_seqlens: expected shape [N + 1] with N >= 1, got {list(shape)}")
    if b != 1:
        raise ValueError(f"{who}: cu_seqlens: packed sequences need batch 1 (x [1, total, nheads, headdim]), "
                         f"got batch {b}")


def sequences(who: str, b: int, seqlen: int, seq_idx, cu_seqlens) -> np.ndarray | None:
    """The packed sequences as cu_seqlens over the b * seqlen tokens (row after row), or None (the b rows)."""
    cu = None
    if cu_seqlens is not None:
        cu = int_array(cu_seqlens, "cu_seqlens", np.int64)
        check_cu_shape(who, b, cu.shape)
        if cu[0] != 0 or cu[-1] != seqlen or np.any(np.diff(cu) < 0):
            raise ValueError(f"{who}: cu_seqlens: must rise from 0 to seqlen = {seqlen}, got {cu.tolist()}")
    if seq_idx is None:
        return cu
    s = int_array(seq_idx, "seq_idx", np.int64)
    if s.shape != (b, seqlen):
        raise ValueError(f"{who}: seq_idx: expected shape [batch, seqlen] = {[b, seqlen]}, got {list(s.shape)}")
    if np.any(np.diff(s, axis=1) < 0):
        raise ValueError(f"{who}: seq_idx: must not decrease along a row")
    starts = [0]
    for r in range(b):
        cuts = np.nonzero(np.diff(s[r]))[0] + 1
        starts += [r * seqlen + int(c) for c in cuts] + [(r + 1) * seqlen]
    from_idx = np.asarray(starts, np.int64)
    if cu is not None and not np.array_equal(np.unique(cu), from_idx):
        raise ValueError(f"{who}: seq_idx: its sequences {from_idx.tolist()} differ from cu_seqlens' {cu.tolist()}")
    return from_idx if cu is None else cu


@dataclass(frozen=True)
class Scan:
    """What the checks of a chunked scan found: x [b, seqlen, h, p], B and C [b, seqlen, g, n], the clamp."""

    b: int
    seqlen: int
    h: int
    p: int
    g: int
    n: int
    limit: tuple


def check_scan(who, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, dt_limit, cu_seqlens,
               return_varlen_states) -> Scan:
    """mamba_chunk_scan_combined's arguments checked by name, their data not read (numpy, torch or JAX,
    traced too); the packed sequences' values are :func:`sequences`'."""
    xs = _float_array(who, "x", x)
    if len(xs) != 4:
        raise ValueError(f"{who}: x: expected shape [batch, seqlen, nheads, headdim], got {list(xs)}")
    b, seqlen, h, p = xs
    bs = shape_of(B, f"{who}: B")
    if len(bs) != 4 or bs[:2] != (b, seqlen):
        raise ValueError(f"{who}: B: expected shape [batch, seqlen, ngroups, dstate] with batch, seqlen = "
                         f"{[b, seqlen]} (x's), got {list(bs)}")
    g, n = bs[2], bs[3]
    _float_array(who, "B", B)
    _float_array(who, "C", C, bs, "[batch, seqlen, ngroups, dstate] (B's)")
    if g < 1 or h % g:
        raise ValueError(f"{who}: B: ngroups = {g} must divide nheads = {h}")
    if not (0 < p <= _MAX_DIM and 0 < n <= _MAX_DIM):
        raise ValueError(f"{who}: x, B: headdim = {p} and dstate = {n} must be in [1, {_MAX_DIM}]")
    _float_array(who, "dt", dt, (b, seqlen, h), "[batch, seqlen, nheads]")
    if z is not None:
        _float_array(who, "z", z, (b, seqlen, h, p), "x's shape")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"{who}: chunk_size: expected a positive int, got {chunk_size!r}")
    if _param_shape(who, "A", A, [(h,)], f"[nheads] = {[h]}") is None:
        raise ValueError(f"{who}: A is required")
    _param_shape(who, "D", D, [(h,), (h, p)], f"[nheads] or [nheads, headdim] = {[h]} or {[h, p]}")
    _param_shape(who, "dt_bias", dt_bias, [(h,)], f"[nheads] = {[h]}")
    limit = _dt_limit(who, dt_limit)
    if initial_states is not None:
        _float_array(who, "initial_states", initial_states, (b, h, p, n), "[batch, nheads, headdim, dstate]")
    if return_varlen_states and cu_seqlens is None:
        raise ValueError(f"{who}: return_varlen_states needs cu_seqlens")
    _check_grad(who, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, initial_states=initial_states)
    return Scan(b, seqlen, h, p, g, n, limit)


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False, *, kernel="auto"):
    """mamba_ssm's ``mamba_chunk_scan_combined``: the SSD scan over chunks (prefill).

    x ``[batch, seqlen, nheads, headdim]``, dt ``[batch, seqlen, nheads]``, A ``[nheads]``, B and C
    ``[batch, seqlen, ngroups, dstate]`` (head h reads group h // (nheads / ngroups)); headdim and
    dstate <= 256. ``chunk_size`` (a positive int) is accepted; kda runs its own chunks (the result
    does not depend on them). ``D`` ``[nheads]`` or ``[nheads, headdim]``: y + D x; ``z`` (x's shape):
    y * silu(z); ``dt_bias`` ``[nheads]``; ``dt_softplus``; ``dt_limit`` (min, max): dt clamped after
    the softplus. ``initial_states`` ``[batch, nheads, headdim, dstate]`` (float32): each row's start.
    Packed sequences: ``seq_idx`` ``[batch, seqlen]`` (non-decreasing per row; a new sequence where it
    changes) and/or ``cu_seqlens`` ``[N + 1]`` (batch 1; both given: the same boundaries); a row's
    initial state is its first sequence's, the others start from zeros.

    Returns out (x's shape and dtype, x's framework), with ``return_final_states`` also each row's
    final state ``[batch, nheads, headdim, dstate]`` float32 (its last sequence's), with
    ``return_varlen_states`` (needs cu_seqlens) each sequence's final state ``[N, nheads, headdim,
    dstate]``: ``out``, ``(out, final_states)``, ``(out, varlen_states)`` or ``(out, final_states,
    varlen_states)``, as mamba_ssm.
    """
    who = "mamba_chunk_scan_combined"
    sc = check_scan(who, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, dt_limit, cu_seqlens,
                    return_varlen_states)
    b, seqlen, h, p, g, n = sc.b, sc.seqlen, sc.h, sc.p, sc.g, sc.n
    cu = sequences(who, b, seqlen, seq_idx, cu_seqlens)
    step = step_size(np, _np_f32(dt), _f32(dt_bias), dt_softplus, sc.limit)
    x32, b32, c32 = _np_f32(x), _np_f32(B), _np_f32(C)
    rows = b if cu is None else 1
    tokens = seqlen if cu is None else b * seqlen
    shape = lambda *inner: (rows, tokens, *inner)  # noqa: E731
    num = b if cu is None else cu.size - 1
    state0 = None
    if initial_states is not None:
        init = np.ascontiguousarray(_np_f32(initial_states))
        state0 = init if cu is None else np.ascontiguousarray(first_states(np, cu, b, seqlen, init))
    o = np.empty((rows, tokens, h, p), np.float32)
    final = np.empty((num, h, p, n), np.float32)
    c = np.ascontiguousarray
    _core.chunk_kda(o=o, final_state=final, q=c(c32.reshape(shape(g, n))), k=c(b32.reshape(shape(g, n))),
                    v=c(x32.reshape(shape(h, p))), g=c((step * _f32(A)).reshape(shape(h))),
                    beta=c(step.reshape(shape(h))), scale=1.0, initial_state=state0, output_final_state=True,
                    state_v_first=True, cu_seqlens=cu, chunk_size=_KDA_CHUNK, kernel=kernel, delta_correction=False)
    out = _framework(finish(np, o.reshape(b, seqlen, h, p), x32, _f32(D), None if z is None else _np_f32(z)), x,
                     np_dtype(x))
    results = [out]
    if return_final_states:
        results.append(_framework(final if cu is None else row_final_states(np, cu, b, seqlen, final), x,
                                  np.dtype(np.float32)))
    if return_varlen_states:
        results.append(_framework(final, x, np.dtype(np.float32)))
    return results[0] if len(results) == 1 else tuple(results)


def _tied(a: np.ndarray, axes: tuple) -> bool:
    """Whether ``a`` is constant along ``axes`` (transformers' expanded per-head values)."""
    first = a[tuple(slice(0, 1) if i in axes else slice(None) for i in range(a.ndim))]
    return bool(np.array_equal(a, np.broadcast_to(first, a.shape)))


@dataclass(frozen=True)
class Step:
    """What the checks of a decode step found: state [rows, *heads, n] (heads (h, p), or (p,) without
    heads: h = 1), x [bsz, *heads], B and C [bsz, g, n] ([bsz, n] without heads: g = 1)."""

    rows: int
    bsz: int
    h: int
    p: int
    g: int
    n: int
    heads: tuple


def check_step(who, state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices) -> Step:
    """selective_state_update's arguments checked by name, their data not read (numpy, torch or JAX,
    traced too); the indices' values are :func:`batch_indices`'."""
    ss = shape_of(state, f"{who}: state")
    heads = len(ss) == 4
    if len(ss) not in (3, 4):
        raise ValueError(f"{who}: state: expected shape [batch, nheads, headdim, dstate] (or [batch, dim, "
                         f"dstate]), got {list(ss)}")
    _float_array(who, "state", state)
    xs = _float_array(who, "x", x)
    if len(xs) != len(ss) - 1 or xs[1:] != ss[1:-1]:
        raise ValueError(f"{who}: x: expected shape [batch, {', '.join(map(str, ss[1:-1]))}] (state's heads), got "
                         f"{list(xs)}")
    bsz = xs[0]
    h, p = (ss[1], ss[2]) if heads else (1, ss[1])
    n = ss[-1]
    bs = shape_of(B, f"{who}: B")
    if len(bs) != len(xs) or bs[0] != bsz or bs[-1] != n:
        raise ValueError(f"{who}: B: expected shape [batch, ngroups, dstate] with batch {bsz}, dstate {n}, got "
                         f"{list(bs)}")
    _float_array(who, "B", B)
    _float_array(who, "C", C, bs, "B's")
    g = bs[1] if heads else 1
    if h % g:
        raise ValueError(f"{who}: B: ngroups = {g} must divide nheads = {h}")
    if not (0 < n <= _MAX_DIM):
        raise ValueError(f"{who}: state: dstate = {n} must be in [1, {_MAX_DIM}]")
    _float_array(who, "dt", dt, xs, "x's shape")
    if z is not None:
        _float_array(who, "z", z, xs, "x's shape")
    hp = ss[1:-1]
    if _param_shape(who, "A", A, [(*hp, n)], f"{list((*hp, n))}") is None:
        raise ValueError(f"{who}: A is required")
    _param_shape(who, "D", D, [hp], f"{list(hp)}")
    _param_shape(who, "dt_bias", dt_bias, [hp], f"{list(hp)}")
    if state_batch_indices is not None:
        size = math.prod(shape_of(state_batch_indices, f"{who}: state_batch_indices"))
        if size != bsz:
            raise ValueError(f"{who}: state_batch_indices: expected {bsz} indices (batch), got {size}")
    elif ss[0] != bsz:
        raise ValueError(f"{who}: state: expected {bsz} rows (x's batch) without state_batch_indices, got {ss[0]}")
    _check_grad(who, state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)
    return Step(ss[0], bsz, h, p, g, n, hp)


def batch_indices(who: str, state_batch_indices, rows: int) -> np.ndarray | None:
    """state_batch_indices' values as int32 [batch] (negative: padding), each < ``rows``; None stays None."""
    if state_batch_indices is None:
        return None
    idx = int_array(state_batch_indices, "state_batch_indices", np.int32).reshape(-1)
    if np.any(idx >= rows):
        raise ValueError(f"{who}: state_batch_indices: must be < {rows} (state's rows), got {idx.tolist()}")
    return idx


def decode_gates(xp, step, a, per_head: bool):
    """A decode step's kernel operands from its step size [bsz, h, p] and A [h, p, n]: (value heads HV,
    their width V, beta [bsz, HV], the gate [bsz, HV] per head or [bsz, HV, n] per channel)."""
    bsz, h, p = step.shape
    if per_head:
        return h, p, step[:, :, 0], step[:, :, 0] * a[None, :, 0, 0]
    # a decay per channel (and per state dimension): KDA's gate over dstate
    return h * p, 1, step.reshape(bsz, h * p), (step[..., None] * a[None]).reshape(bsz, h * p, a.shape[-1])


def padded_out(xp, idx, x32):
    """x [bsz, h, p] with the padding rows (negative indices) zeroed: their out is zeros, D x left out too."""
    return x32 if idx is None else xp.where((idx < 0)[:, None, None], xp.float32(0.0), x32)


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, *, kernel="auto"):
    """mamba_ssm's ``selective_state_update``: one token of the SSD recurrence, ``state`` updated in place.

    state ``[S, nheads, headdim, dstate]`` (S = batch, or the pool with ``state_batch_indices``;
    float32, bfloat16 or float16, C-contiguous), x ``[batch, nheads, headdim]``, dt
    ``[batch, nheads, headdim]``, A ``[nheads, headdim, dstate]``, B and C ``[batch, ngroups, dstate]``,
    D and dt_bias ``[nheads, headdim]``, z x's shape; or mamba_ssm's form without heads (state
    ``[S, dim, dstate]``, x ``[batch, dim]``, ...: one head). dt = dt + dt_bias, softplus with
    ``dt_softplus`` (no clamp, as mamba_ssm); state = exp(dt A) state + dt x B; out = state C + D x,
    times silu(z) when given. ``state_batch_indices`` ``[batch]`` int: row i reads and writes
    ``state[state_batch_indices[i]]`` (negative: padding, zeros out and no state touched). dt, dt_bias
    and A as transformers passes them (expanded from one value per head) run per head; values that
    vary along headdim (or A along dstate) run per channel, as mamba_ssm.

    Returns out (x's shape and dtype, x's framework).
    """
    who = "selective_state_update"
    sp = check_step(who, state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
    if not isinstance(state, np.ndarray) and not is_torch(state):
        raise TypeError(f"{who}: state: expected a numpy array or a torch tensor (updated in place), got "
                        f"{type(state).__name__}")
    if not (state.is_contiguous() if is_torch(state) else state.flags.c_contiguous):
        raise ValueError(f"{who}: state: must be C-contiguous (it is updated in place)")
    idx = batch_indices(who, state_batch_indices, sp.rows)
    bsz, h, p, g, n = sp.bsz, sp.h, sp.p, sp.g, sp.n
    bias = _f32(dt_bias)
    step = step_size(np, _np_f32(dt).reshape(bsz, h, p), None if bias is None else bias.reshape(h, p), dt_softplus)
    a = _f32(A).reshape(h, p, n)
    x32 = _np_f32(x).reshape(bsz, h, p)
    hv, v, beta, gate = decode_gates(np, step, a, _tied(step, (2,)) and _tied(a, (1, 2)))
    st = state.reshape(sp.rows, hv, v, n)  # V-first [S, HV, V, K]: mamba_ssm's [S, nheads, headdim, dstate]
    o = np.empty((bsz, 1, hv, v), np.float32)
    _core.fused_recurrent_kda(
        o=o, final_state=None, q=np.ascontiguousarray(_np_f32(C).reshape(bsz, 1, g, n)),
        k=np.ascontiguousarray(_np_f32(B).reshape(bsz, 1, g, n)), v=np.ascontiguousarray(x32.reshape(bsz, 1, hv, v)),
        g=np.ascontiguousarray(gate.reshape(bsz, 1, *gate.shape[1:]), np.float32),
        beta=np.ascontiguousarray(beta.reshape(bsz, 1, hv), np.float32),
        initial_state=for_core_writable(st, "state"), scale=1.0, inplace_final_state=True, state_v_first=True,
        ssm_state_indices=idx, kernel=kernel, delta_correction=False)
    d = _f32(D)
    y = finish(np, o.reshape(bsz, h, p), padded_out(np, idx, x32), None if d is None else d.reshape(h, p),
               None if z is None else _np_f32(z).reshape(bsz, h, p))
    return _framework(y, x, np_dtype(x)).reshape(sp.bsz, *sp.heads)
