"""Array plumbing between numpy / torch / JAX arrays and kda._core.

kda._core reads any CPU array that speaks DLPack (or the buffer protocol) in place. numpy has no
native bfloat16: ml_dtypes.bfloat16 arrays cross as uint16 views of the same memory, which the
core reads as bf16 bits. Outputs are allocated here, by the framework of the first input (torch
in, torch out; numpy and JAX in, numpy out), and the core writes into them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def is_jax(x) -> bool:
    mod = type(x).__module__.split(".")[0]
    return mod in ("jax", "jaxlib")


def shape_of(x, name: str) -> tuple:
    try:
        return tuple(int(d) for d in x.shape)
    except AttributeError:
        raise TypeError(f"{name}: expected an array (numpy, torch or JAX), got {type(x).__name__}") from None


def for_core(x, name: str):
    """The object the core reads for ``x``: the array itself, or a view of it (no copy)."""
    if isinstance(x, np.ndarray):
        if x.dtype == np.uint16:  # the core reads uint16 as bf16 bits: only our own views may be
            raise TypeError(f"{name}: dtype must be float32, bfloat16 or float16, got uint16")
        return x.view(np.uint16) if x.dtype == BF16 else x
    if is_torch(x):
        import torch

        if x.dtype == torch.uint16:
            raise TypeError(f"{name}: dtype must be float32, bfloat16 or float16, got torch.uint16")
        return x.detach()  # a tensor that requires grad cannot be exported through DLPack
    if is_jax(x) or hasattr(x, "__dlpack__"):
        if np_dtype(x) == np.uint16:
            raise TypeError(f"{name}: dtype must be float32, bfloat16 or float16, got uint16")
        return x
    raise TypeError(f"{name}: expected an array (numpy, torch or JAX), got {type(x).__name__}")


def spec_of(x, name: str) -> tuple:
    """``x`` as a shape spec for the core's checks: (dtype name, shape), its data not read."""
    dt = np_dtype(x)
    return (dt.name if dt is not None else str(x.dtype).removeprefix("torch."), shape_of(x, name))


def for_core_writable(x, name: str):
    """As for_core, for an array the core writes into (numpy writeable, or torch)."""
    if isinstance(x, np.ndarray):
        if not x.flags.writeable:
            raise ValueError(f"{name}: is read-only, but it is updated in place")
        return for_core(x, name)
    if is_torch(x):
        return x.detach()
    raise TypeError(f"{name}: is updated in place, so it must be a numpy array or a torch tensor "
                    f"(got {type(x).__module__}.{type(x).__name__}; JAX arrays are immutable: use kda.jax)")


def np_dtype(x) -> np.dtype | None:
    """x's dtype as numpy spells it (torch.bfloat16 as ml_dtypes.bfloat16); None if unknown."""
    if is_torch(x):
        import torch

        return {torch.float32: np.dtype(np.float32), torch.bfloat16: BF16, torch.float16: np.dtype(np.float16)}.get(
            x.dtype)
    try:
        return np.dtype(x.dtype)
    except TypeError:
        return None


def empty_like_framework(like, shape, dtype: np.dtype, zero: bool = False):
    """An array of ``shape`` and ``dtype`` (float32, bfloat16 or float16): torch if ``like`` is, else numpy."""
    if is_torch(like):
        import torch

        tdt = {BF16: torch.bfloat16, np.dtype(np.float16): torch.float16}.get(dtype, torch.float32)
        return (torch.zeros if zero else torch.empty)(shape, dtype=tdt, device="cpu")
    if dtype not in (np.dtype(np.float32), BF16, np.dtype(np.float16)):
        dtype = np.dtype(np.float32)  # the core refuses the input's dtype before writing
    return (np.zeros if zero else np.empty)(shape, dtype=dtype)


def int_array(x, name: str, dtype) -> np.ndarray:
    """A small index array (cu_seqlens, state indices) as a contiguous numpy array of ``dtype``."""
    if is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: dtype must be an integer type, got {a.dtype}")
    info = np.iinfo(dtype)
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise ValueError(f"{name}: values out of the range of {np.dtype(dtype).name}")
    return np.ascontiguousarray(a, dtype=dtype)


def param_f32(x, name: str) -> np.ndarray:
    """A small float parameter (A_log, dt_bias) as contiguous float32 numpy."""
    if is_torch(x):
        import torch

        x = x.detach().to(device="cpu", dtype=torch.float32).numpy()
    a = np.asarray(x)
    if a.dtype.kind != "f" and a.dtype != BF16:
        raise TypeError(f"{name}: dtype must be a float type, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


def from_core(a: np.ndarray, bf16: bool, like=None):
    """A numpy array the core returned (bf16 as uint16 bits), as ml_dtypes / torch for ``like``."""
    if bf16:
        a = a.view(BF16)
    if like is not None and is_torch(like):
        import torch

        t = torch.from_numpy(a.view(np.uint16) if bf16 else a)
        return t.view(torch.bfloat16) if bf16 else t
    return a
