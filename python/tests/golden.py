"""Golden cases for the Python tests: locating them and reading their safetensors.

As tests/golden.h: every test runs on the sets the project's own float64 references
(tools/delta_rule_ref.py; tools/mamba2_ref.py for the Mamba2 mixers' mamba2-* sets) write at test time
into ``$KDA_BINARY_DIR/golden`` (default ``<repo>/build/golden``; ctest's golden_generate fixture), or on
$KDA_GOLDEN_DIR's; ``generated/<set>`` names a set of the build tree always. The independent sets of
``<repo>/../shared/golden`` (or $KDA_SHARED_GOLDEN_DIR), named ``shared/<set>``, run in addition where they
exist. Missing golden data skips visibly, or fails when KDA_REQUIRE_GOLDEN=1.

The tolerance rules of design §5 (base/tolerance.cc) are ported here as numpy checks, unchanged.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

_DTYPES = {
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
    "U8": np.dtype(np.uint8),
}

GENERATED_PREFIX = "generated/"
SHARED_PREFIX = "shared/"
# The sets every test runs on by these names (the others of the build tree are ``generated/<set>``).
PROJECT_SETS = ("kda-mini", "kda-stress", "kda-loud", "gdn-mini", "gdn-gva3", "gdn-loud")

TOOLS = REPO.parent / "shared" / "tools"


def shared_tool(name: str):
    """A float64 recurrence ``recurrent(q, k, v, g, beta, S)`` (kda_ref: g [T, H, K]; gdn_ref: g [T, HV]):
    the independent one of ../shared/tools where it exists (imported from there, never copied here), else
    the project's own (tools/delta_rule_ref.py, which takes either gate width)."""
    tools = TOOLS if (TOOLS / f"{name}.py").exists() else REPO / "tools"
    module = name if tools == TOOLS else "delta_rule_ref"
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))
    return importlib.import_module(module)


@pytest.fixture(scope="module")
def gdn_ref():
    """../shared/tools/gdn_ref.py, the float64 Gated DeltaNet reference: recurrent(q, k, v, g, beta, S)
    applies the L2 norm and K^-0.5 itself (q, k [T, H, K], v [T, HV, V], g, beta [T, HV], S [HV, K, V]).
    A fixture: import it into a test module to use it."""
    return shared_tool("gdn_ref")


def generated_golden_dir() -> Path:
    env = os.environ.get("KDA_BINARY_DIR")
    return (Path(env) if env else REPO / "build") / "golden"


def golden_dir() -> Path:
    env = os.environ.get("KDA_GOLDEN_DIR")
    return Path(env) if env else generated_golden_dir()


def shared_golden_dir() -> Path:
    env = os.environ.get("KDA_SHARED_GOLDEN_DIR")
    return Path(env) if env is not None else REPO.parent / "shared" / "golden"


def golden_set_dir(name: str) -> Path:
    """``kda-mini`` under golden_dir(); ``generated/kda-real`` under generated_golden_dir();
    ``shared/kda-mini`` under shared_golden_dir()."""
    if name.startswith(GENERATED_PREFIX):
        return generated_golden_dir() / name[len(GENERATED_PREFIX):]
    if name.startswith(SHARED_PREFIX):
        return shared_golden_dir() / name[len(SHARED_PREFIX):]
    return golden_dir() / name


def golden_required() -> bool:
    return os.environ.get("KDA_REQUIRE_GOLDEN") == "1"


def require_golden(path: Path) -> None:
    """Skips the calling test (or fails it under KDA_REQUIRE_GOLDEN=1) when ``path`` is missing."""
    if not Path(path).exists():
        msg = f"golden data missing: {path} (set KDA_GOLDEN_DIR)"
        if golden_required():
            pytest.fail(msg)
        pytest.skip(msg)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a numpy array (bf16 as ml_dtypes.bfloat16)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data, dtype=dt, count=(end - begin) // dt.itemsize, offset=base + begin)
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Writes numpy arrays (dtypes of the table above) as a safetensors file."""
    names = {v: k for k, v in _DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        blob = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_checkpoint_tensors(model_dir: Path, names: list[str]) -> dict[str, np.ndarray]:
    """Tensors of a checkpoint directory: model.safetensors, or the shards its
    model.safetensors.index.json maps them to."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {weight_map[n] for n in names}
    else:
        files = {"model.safetensors"}
    out = {}
    for f in sorted(files):
        t = read_safetensors(model_dir / f)
        out.update({n: t[n] for n in names if n in t})
    return out


def model_type(set_dir: Path) -> str:
    """The ``model_type`` of a golden set's config.json ("" when it names none)."""
    with open(set_dir / "config.json") as f:
        return str(json.load(f).get("model_type", ""))


KDA_MODEL_TYPES = ("kimi_linear",)
# The Gated DeltaNet sets' model types (gdn-mini and gdn-loud: qwen3_next, gdn-gva3: qwen3_5_text).
GDN_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
# The delta-rule families' sets, generated from tools/delta_rule_ref.py (generated/glm5-mini, bailing-mini,
# olmo-mini, lara-mini, qwen4-mini).
DELTA_RULE_MODEL_TYPES = ("glm5_next", "bailing_hybrid", "olmo_hybrid", "lara_mini", "qwen4_exp")


def _set_cases(root: Path, model_types, prefix: str = "", keep=lambda name: True) -> list[tuple[str, str]]:
    """(prefix + set, case) for every case file of every set under ``root`` whose config.json has one of
    ``model_types`` and whose name ``keep`` takes (scratch directories of a set being written, ``*.tmp``,
    left out)."""
    cases = []
    if root.is_dir():
        sets = (p for p in root.iterdir()
                if not p.name.endswith(".tmp") and (p / "config.json").exists() and model_type(p) in model_types
                and keep(p.name))
        for d in sorted(sets):
            for f in sorted(d.glob("*.safetensors")):
                if f.name != "model.safetensors" and not f.name.startswith("model-"):
                    cases.append((prefix + d.name, f.stem))
    return cases


def golden_cases(model_types=KDA_MODEL_TYPES) -> list[tuple[str, str]]:
    """(set, case) for every case file of the project's sets (PROJECT_SETS under golden_dir()) whose
    config.json has one of ``model_types`` (default: the KDA sets, model_type kimi_linear), then those of the
    other sets generated at test time (generated/kda-real: kimi_linear; the DELTA_RULE_MODEL_TYPES sets), then
    the independent sets of shared_golden_dir() (shared/<set>) where it exists. Empty when nothing has been
    generated (the tests then skip or fail). The Gated DeltaNet sets (gdn-*, GDN_MODEL_TYPES) are the kernel
    tests of test_gdn.py and, with them asked for, the layer tests'."""
    project = _set_cases(golden_dir(), model_types, keep=lambda n: n in PROJECT_SETS)
    generated = _set_cases(generated_golden_dir(), model_types, GENERATED_PREFIX, keep=lambda n: n not in PROJECT_SETS)
    shared = _set_cases(shared_golden_dir(), model_types, SHARED_PREFIX, keep=lambda n: n in PROJECT_SETS)
    return project + generated + shared


def load_case(set_name: str, case: str) -> dict[str, np.ndarray]:
    path = golden_set_dir(set_name) / f"{case}.safetensors"
    require_golden(path)
    return read_safetensors(path)


# --- Tolerance rules of design §5 (a port of base/tolerance.cc) ---------------------------------


class ToleranceError(AssertionError):
    pass


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).ravel()


def check_f32(a, r, atol: float = 1e-5, rtol: float = 1e-5, what: str = "") -> None:
    """fp32 rule: every element |a - r| <= atol + rtol |r| (NaN fails)."""
    a, r = _f64(a), _f64(r)
    assert a.shape == r.shape, f"{what}: {a.shape} vs {r.shape}"
    d = np.abs(a - r)
    tol = atol + rtol * np.abs(r)
    bad = ~(d <= tol)
    if bad.any():
        i = int(np.argmax(bad))
        ratio = np.nanmax(np.where(np.isnan(d), np.inf, d / tol))
        raise ToleranceError(f"{what}: {int(bad.sum())} of {a.size} outside (first at {i}: got {a[i]} want {r[i]}), "
                             f"max err/tol {ratio}")


def check_state_f32(a, r, what: str = "") -> None:
    """fp32 rule for final states: 1e-5 max(1, max|r|) + 1e-5 |r|."""
    r64 = _f64(r)
    max_abs = float(np.max(np.abs(r64))) if r64.size else 0.0
    check_f32(a, r64, atol=1e-5 * max(1.0, max_abs), rtol=1e-5, what=what)


def ulp_bf16(m: np.ndarray) -> np.ndarray:
    """Spacing of bf16 numbers at magnitude m: 2^(floor(log2 m) - 7); 0 for 0 and non-finite m."""
    m = np.asarray(m, dtype=np.float64)
    ok = (m != 0) & np.isfinite(m)
    _, e = np.frexp(np.where(ok, m, 1.0))  # m = f 2^e, f in [0.5, 1): ilogb(m) = e - 1
    return np.where(ok, np.ldexp(1.0, (e - 1 - 7).astype(np.int32)), 0.0)


def _ratio(num: float, limit: float) -> float:
    if np.isnan(num):
        return np.inf
    if limit > 0:
        return num / limit
    return np.inf if num > 0 else 0.0


def compare_bf16(a, r, x) -> dict:
    """bf16 rule v2 of design §5 (kda::CompareBF16): a tested, r reference bf16 pipeline, x exact."""
    a, r, x = _f64(a), _f64(r), _f64(x)
    n = a.size
    u = ulp_bf16(np.maximum(np.abs(a), np.abs(r)))
    tol_r = 1e-3 + 1e-3 * np.abs(r) + u
    tol_x = 1e-3 + 1e-3 * np.abs(x) + u
    d_ar, d_ax, d_rx = np.abs(a - r), np.abs(a - x), np.abs(r - x)
    outside = int(np.sum(~(d_ar <= tol_r)))
    max_ax = float(np.max(np.where(np.isnan(d_ax), np.inf, d_ax / tol_x))) if n else 0.0
    max_rx = float(np.max(d_rx / tol_x)) if n else 0.0
    r2, x2 = float(np.sum(r * r)), float(np.sum(x * x))
    ar2, ax2, rx2 = float(np.sum(d_ar**2)), float(np.sum(d_ax**2)), float(np.sum(d_rx**2))
    rel_l2 = np.sqrt(ar2 / r2) if r2 > 0 else np.sqrt(ar2)
    rel_l2_ax = np.sqrt(ax2 / x2) if x2 > 0 else np.sqrt(ax2)
    rel_l2_rx = np.sqrt(rx2 / x2) if x2 > 0 else np.sqrt(rx2)
    share = outside / n if n else 0.0
    max_ratio = max(_ratio(rel_l2, 2e-3), _ratio(share, 5e-3), _ratio(rel_l2_ax, 1.1 * rel_l2_rx),
                    _ratio(max_ax, 1.5 * max_rx))
    nan = bool(np.isnan(a).any())
    return {
        "ok": (not nan) and max_ratio <= 1.0,
        "max_ratio": np.inf if nan else max_ratio,
        "rel_l2": rel_l2,
        "outside": outside,
        "n": n,
        "rel_l2_ax": rel_l2_ax,
        "rel_l2_rx": rel_l2_rx,
        "max_ax": max_ax,
        "max_rx": max_rx,
    }


def check_bf16(a, r, x, what: str = "") -> None:
    rep = compare_bf16(a, r, x)
    if not rep["ok"]:
        raise ToleranceError(f"{what}: bf16 rule failed: {rep}")


def rounded_bf16(v) -> np.ndarray:
    """v rounded to bf16 once (round to nearest even), as fp32."""
    return np.asarray(v, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
