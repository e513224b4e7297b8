"""A kda.jax call checked once, and its arrays and static facts as the jitted cores take them.

The same calls serve KDA's entries and Gated DeltaNet's (``entry``: "kda" or "gated_delta_rule", the name
the core's messages carry); g's rank gives the gate's width ([B, T, HV, K] per key dimension, [B, T, HV] a
scalar per value head).

Both backends check a call the same way, when it is traced: by the C++ call description
(kda/kernels/kda_args.h) through kda._core's shape check (``check_only``), whose messages surface
unchanged. Shapes, dtypes and options are static under ``jax.jit``; the small index arrays
(``cu_seqlens``, the state indices, ``num_accepted_tokens``) are also checked by value when they are
concrete (an eager call), by the same check. When one of them is traced its values are checked when
the call runs: by the FFI kernels themselves, and for the naive kernels by that same core check on
the values (:class:`ValueCheck`, a host callback the naive kernels' results depend on); either way a
bad value fails the call with a runtime error naming the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp
import numpy as np

from .. import _kernels


def is_concrete(x) -> bool:
    return x is not None and not isinstance(x, jax.core.Tracer)


def as_array(who: str, name: str, x):
    """x as a JAX array (numpy arrays and lists are converted), None as None, else TypeError."""
    if x is None or isinstance(x, jax.Array):
        return x
    if isinstance(x, (np.ndarray, list, tuple, np.generic, float, int)):
        return jnp.asarray(x)
    raise TypeError(f"{who}: {name} must be an array, got {type(x).__name__}")


def spec(x, cast=None):
    """A tensor argument of the core's shape check: None, or (dtype name, shape); ``cast``: the dtype
    the call converts it to (a float parameter to float32, an index array to int32)."""
    if x is None:
        return None
    dt = jnp.dtype(x.dtype)
    if cast is not None:
        kind = jnp.floating if jnp.issubdtype(cast, jnp.floating) else jnp.integer
        if jnp.issubdtype(dt, kind):
            dt = jnp.dtype(cast)
    return (dt.name, tuple(int(d) for d in x.shape))


def index_spec(x):
    """An index argument: its values when concrete (int32, as the kernels take them), else its spec."""
    if x is None or not is_concrete(x):
        return spec(x, jnp.int32)
    a = np.asarray(x)
    if a.dtype.kind in "iu" and a.size and (a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
        return a  # the core names the dtype; the cast would wrap
    return a.astype(np.int32) if a.dtype.kind in "iu" else a


def _index(x):
    """An index array as the kernels take it (int32), or None. Numpy int64 values were checked to fit."""
    if x is None:
        return None
    if isinstance(x, jax.Array):
        return x.astype(jnp.int32)
    return jnp.asarray(np.asarray(x).astype(np.int32))


def _param(x, n: int):
    """A float parameter (A_log [HV], dt_bias [HV * K] or [HV, K], or [HV] with a scalar gate) as float32
    [n], or None."""
    if x is None:
        return None
    x = x if isinstance(x, jax.Array) else jnp.asarray(np.asarray(x))
    return x.astype(jnp.float32).reshape(n)


def static_float(who: str, name: str, x) -> float | None:
    """A scalar option (scale, lower_bound) as the static Python float it must be (None stays None)."""
    if x is None:
        return None
    if isinstance(x, (jax.Array, np.ndarray)) and x.ndim == 0 and is_concrete(x):
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (float, int, np.floating, np.integer)):
        raise TypeError(f"{who}: {name} must be a Python float (static) or None, got {type(x).__name__}")
    return float(x)


@dataclass(frozen=True)
class ValueCheck:
    """The core's check of a call whose index values are traced, made again on their values when the call
    runs (the naive kernels call it through a host callback; the FFI kernels check the values themselves).

    ``args``: the core's other arguments as the trace-time check took them (shape specs, options);
    ``fields``: (Call field, core keyword) of every index array given, in the order the values come;
    ``num_chunks``: the static NT of the intermediate states, checked against the count the values imply.
    """

    entry: str  # kda._core's function: "chunk_kda" or "fused_recurrent_kda" (``args`` carry the entry's name)
    args: tuple
    fields: tuple
    num_chunks: int | None = None

    def __call__(self, *values) -> np.ndarray:
        """Raises the core's ValueError naming a bad value; returns int32 0."""
        kw = dict(self.args)
        kw.update({name: np.asarray(x) for (_, name), x in zip(self.fields, values)})
        s = getattr(_core(), self.entry)(**kw, check_only=True)
        if self.num_chunks is not None:
            _num_chunks(_kernels.CHUNK_NAMES[kw.get("entry", "kda")], s, self.num_chunks)
        return np.int32(0)


def _value_check(entry: str, kw: dict, index_args: dict, num_chunks: int | None = None) -> ValueCheck | None:
    """The check of the index values at run time when one of ``index_args`` ({Call field: (core keyword,
    argument)}) is traced; None when all are concrete (the core checked their values already)."""
    given = [(f, name, x) for f, (name, x) in index_args.items() if x is not None]
    if all(is_concrete(x) for _, _, x in given):
        return None
    names = {name for _, name, _ in given}
    return ValueCheck(entry, tuple((k, v) for k, v in kw.items() if k not in names),
                      tuple((f, name) for f, name, _ in given), num_chunks)


@dataclass(frozen=True)
class Statics:
    """What is static in a checked call (hashable: a static argument of the jitted cores)."""

    kind: str  # "chunk" or "recurrent"
    scale: float | None  # None: K^-0.5
    use_qk_l2norm_in_kernel: bool
    use_gate_in_kernel: bool
    use_beta_sigmoid_in_kernel: bool
    allow_neg_eigval: bool
    lower_bound: float | None
    state_v_first: bool
    output_final_state: bool
    B: int
    T: int
    N: int
    H: int
    HV: int
    K: int
    V: int
    # chunk_kda
    safe_gate: bool = False
    chunk_size: int = 64
    return_intermediate_states: bool = False
    num_chunks: int = 0  # NT of the intermediate states [B, NT, HV, K, V]
    # fused_recurrent_kda_fwd
    inplace_final_state: bool = False
    beta_per_value: bool = False  # beta [B, T, HV, V]
    # The index values to check when the call runs (some traced), or None (checked at trace time).
    value_check: ValueCheck | None = None
    # "kda" or "gated_delta_rule": the entry (the FFI target, the name in messages).
    entry: str = "kda"
    scalar_gate: bool = False  # g [B, T, HV]: one decay per value head (GDN)
    delta_correction: bool = True  # False: Mamba2's SSD recurrence, S += beta k v^T (kda.jax.mamba_ssm)

    @property
    def gate_width(self) -> int:
        """g's last dimension per value head: K, or 1 for a scalar gate."""
        return 1 if self.scalar_gate else self.K

    @property
    def state_dims(self) -> tuple:
        """The inner dims of a state: (K, V), or (V, K) with state_v_first."""
        return (self.V, self.K) if self.state_v_first else (self.K, self.V)

    @property
    def scale_value(self) -> float:
        return self.K**-0.5 if self.scale is None else self.scale


@dataclass
class Call:
    """A checked call: the statics and the arrays (indices int32, A_log / dt_bias float32 [HV], [HV * K]
    or, with a scalar gate g [B, T, HV], [HV]).

    ``state``: chunk_kda's initial state [N, HV, K, V] or pool [S, HV, K, V] (with ``indices``);
    fused_recurrent_kda_fwd's ``initial_state`` (the pool with ``indices``). ``indices``: chunk_kda's
    ``state_indices`` [N] or fused_recurrent_kda_fwd's ``ssm_state_indices`` [N] / [N, C]. ``out``: o's
    buffer (fused_recurrent_kda_fwd). States are [.., HV, V, K] with ``state_v_first``.
    """

    st: Statics
    q: jax.Array
    k: jax.Array
    v: jax.Array
    g: jax.Array
    beta: jax.Array
    state: jax.Array | None = None
    out: jax.Array | None = None
    cu_seqlens: jax.Array | None = None
    indices: jax.Array | None = None
    num_accepted_tokens: jax.Array | None = None
    A_log: jax.Array | None = None
    dt_bias: jax.Array | None = None

    _REST = ("q", "k", "v", "g", "beta", "cu_seqlens", "indices", "num_accepted_tokens", "A_log", "dt_bias")

    def split(self):
        """(state, out, the other arrays): the jitted cores take state and out apart (to donate them)."""
        return self.state, self.out, tuple(getattr(self, n) for n in self._REST)

    @classmethod
    def join(cls, st: Statics, state, out, rest) -> Call:
        return cls(st, state=state, out=out, **dict(zip(cls._REST, rest)))

    def named_arrays(self):
        """(argument name, array) of every array of the call, for the CPU check of the FFI kernels."""
        chunk = self.st.kind == "chunk"
        names = {"state": "initial_state", "indices": "state_indices" if chunk else "ssm_state_indices"}
        return [(names.get(f.name, f.name), getattr(self, f.name)) for f in fields(self) if f.name != "st"]


def _core():
    from .. import _core

    return _core


def _tokens(who, q, k, v, g, beta, A_log, dt_bias, cu_seqlens):
    q, k, v, g, beta = (as_array(who, n, x) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)))
    A_log, dt_bias, cu_seqlens = (as_array(who, n, x) if not isinstance(x, np.ndarray) else x
                                  for n, x in (("A_log", A_log), ("dt_bias", dt_bias), ("cu_seqlens", cu_seqlens)))
    return q, k, v, g, beta, A_log, dt_bias, cu_seqlens


def _common_statics(s: dict, scale, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                    allow_neg_eigval, lower_bound, state_v_first, output_final_state) -> dict:
    return dict(scale=scale, use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel),
                use_gate_in_kernel=bool(use_gate_in_kernel),
                use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel), allow_neg_eigval=bool(allow_neg_eigval),
                lower_bound=lower_bound, state_v_first=bool(state_v_first),
                output_final_state=bool(output_final_state), B=int(s["B"]), T=int(s["T"]), N=int(s["N"]),
                H=int(s["H"]), HV=int(s["HV"]), K=int(s["K"]), V=int(s["V"]))


def _num_chunks(who: str, s: dict, num_chunks) -> int:
    """NT of the intermediate states: the core's count, or with a traced cu_seqlens (the core reports -1)
    the static ``num_chunks``, which must agree with a known count."""
    if num_chunks is not None and (isinstance(num_chunks, bool) or not isinstance(num_chunks, (int, np.integer))):
        raise TypeError(f"{who}: num_chunks must be a Python int (static) or None, got {type(num_chunks).__name__}")
    nt = int(s["num_chunks"])
    if nt < 0:
        if num_chunks is None:
            raise ValueError(f"{who}: return_intermediate_states with a traced cu_seqlens needs num_chunks=, the "
                             "total number of chunks over the sequences (static: the size of the result), or "
                             "cu_seqlens_cpu= with concrete values")
        if num_chunks < 0:
            raise ValueError(f"{who}: num_chunks must be >= 0, got {num_chunks}")
        return int(num_chunks)
    if num_chunks is not None and int(num_chunks) != nt:
        raise ValueError(f"{who}: num_chunks must be the number of chunks, {nt}, got {num_chunks}")
    return nt


def check_chunk(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                return_intermediate_states, state_v_first, cu_seqlens, A_log, dt_bias, chunk_size, state_indices,
                num_chunks, entry: str = "kda", delta_correction: bool = True) -> Call:
    """chunk_kda's (or chunk_gated_delta_rule's, ``entry="gated_delta_rule"``) arguments checked by the core
    (ChunkKdaCall) and converted for the cores."""
    who = _kernels.CHUNK_NAMES[entry]
    q, k, v, g, beta, A_log, dt_bias, cu_seqlens = _tokens(who, q, k, v, g, beta, A_log, dt_bias, cu_seqlens)
    initial_state = as_array(who, "initial_state", initial_state)
    scale = static_float(who, "scale", scale)
    lower_bound = static_float(who, "lower_bound", lower_bound)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)):
        raise TypeError(f"{who}: chunk_size must be a Python int (static), got {type(chunk_size).__name__}")
    gate = bool(use_gate_in_kernel)
    pool = state_indices is not None
    kw = dict(
        o=None, final_state=None, q=spec(q), k=spec(k), v=spec(v), g=spec(g), beta=spec(beta), scale=scale,
        initial_state=None if pool else spec(initial_state), output_final_state=bool(output_final_state),
        use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), use_gate_in_kernel=gate,
        use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel), allow_neg_eigval=bool(allow_neg_eigval),
        safe_gate=bool(safe_gate), lower_bound=lower_bound, state_v_first=bool(state_v_first),
        cu_seqlens=index_spec(cu_seqlens), A_log=spec(A_log, jnp.float32) if gate else None,
        dt_bias=spec(dt_bias, jnp.float32) if gate else None, chunk_size=int(chunk_size),
        state=spec(initial_state) if pool else None, state_indices=index_spec(state_indices),
        return_intermediate_states=bool(return_intermediate_states), entry=entry,
        delta_correction=bool(delta_correction))
    s = _core().chunk_kda(**kw, check_only=True)
    nt = 0
    if return_intermediate_states:
        nt = _num_chunks(who, s, num_chunks)
    elif num_chunks is not None:
        raise ValueError(f"{who}: num_chunks is the size of the intermediate states: it needs "
                         "return_intermediate_states=True")
    st = Statics(kind="chunk",
                 **_common_statics(s, scale, use_qk_l2norm_in_kernel, gate, use_beta_sigmoid_in_kernel,
                                   allow_neg_eigval, lower_bound, state_v_first, output_final_state),
                 safe_gate=bool(safe_gate), chunk_size=int(chunk_size),
                 return_intermediate_states=bool(return_intermediate_states), num_chunks=nt,
                 value_check=_value_check("chunk_kda", kw, {"cu_seqlens": ("cu_seqlens", cu_seqlens),
                                                            "indices": ("state_indices", state_indices)},
                                          nt if return_intermediate_states else None),
                 entry=entry, scalar_gate=bool(s["scalar_gate"]), delta_correction=bool(delta_correction))
    # As fla: A_log and dt_bias only matter with the gate in the kernel.
    return Call(st, q, k, v, g, beta, state=initial_state, cu_seqlens=_index(cu_seqlens),
                indices=_index(state_indices), A_log=_param(A_log, st.HV) if gate else None,
                dt_bias=_param(dt_bias, st.HV * st.gate_width) if gate else None)


def check_recurrent(q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state, inplace_final_state,
                    state_v_first, cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel,
                    use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, out,
                    entry: str = "kda", delta_correction: bool = True) -> Call:
    """fused_recurrent_kda_fwd's (or the Gated DeltaNet recurrent entries', ``entry="gated_delta_rule"``)
    arguments checked by the core (RecurrentKdaCall) and converted."""
    who = _kernels.RECURRENT_NAMES[entry]  # the core's name of the call
    q, k, v, g, beta, A_log, dt_bias, cu_seqlens = _tokens(who, q, k, v, g, beta, A_log, dt_bias, cu_seqlens)
    initial_state = as_array(who, "initial_state", initial_state)
    out = as_array(who, "out", out)
    scale = static_float(who, "scale", scale)
    lower_bound = static_float(who, "lower_bound", lower_bound)
    gate = bool(use_gate_in_kernel)
    kw = dict(
        o=spec(out), final_state=None, q=spec(q), k=spec(k), v=spec(v), g=spec(g), beta=spec(beta),
        A_log=spec(A_log, jnp.float32) if gate else None, dt_bias=spec(dt_bias, jnp.float32) if gate else None,
        initial_state=spec(initial_state), scale=scale, output_final_state=bool(output_final_state),
        inplace_final_state=bool(inplace_final_state), state_v_first=bool(state_v_first),
        cu_seqlens=index_spec(cu_seqlens), ssm_state_indices=index_spec(ssm_state_indices),
        num_accepted_tokens=index_spec(num_accepted_tokens), use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel),
        use_gate_in_kernel=gate, use_beta_sigmoid_in_kernel=bool(use_beta_sigmoid_in_kernel),
        allow_neg_eigval=bool(allow_neg_eigval), lower_bound=lower_bound, entry=entry,
        delta_correction=bool(delta_correction))
    s = _core().fused_recurrent_kda(**kw, check_only=True)
    if inplace_final_state and initial_state is None:
        # The shape check leaves this to the run (a caller learning N); here the run is traced next.
        raise ValueError(f"{who}: initial_state: required with inplace_final_state=True (the state pool, or "
                         f"[N, HV, K, V])")
    st = Statics(kind="recurrent",
                 **_common_statics(s, scale, use_qk_l2norm_in_kernel, gate, use_beta_sigmoid_in_kernel,
                                   allow_neg_eigval, lower_bound, state_v_first, output_final_state),
                 inplace_final_state=bool(inplace_final_state), beta_per_value=beta.ndim == 4,
                 value_check=_value_check("fused_recurrent_kda", kw,
                                          {"cu_seqlens": ("cu_seqlens", cu_seqlens),
                                           "indices": ("ssm_state_indices", ssm_state_indices),
                                           "num_accepted_tokens": ("num_accepted_tokens", num_accepted_tokens)}),
                 entry=entry, scalar_gate=bool(s["scalar_gate"]), delta_correction=bool(delta_correction))
    return Call(st, q, k, v, g, beta, state=initial_state, out=out, cu_seqlens=_index(cu_seqlens),
                indices=_index(ssm_state_indices), num_accepted_tokens=_index(num_accepted_tokens),
                A_log=_param(A_log, st.HV) if gate else None,
                dt_bias=_param(dt_bias, st.HV * st.gate_width) if gate else None)
