"""Every example under examples/ runs to its end (with the golden kda-mini checkpoint when present)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from golden import REPO, golden_set_dir

EXAMPLES = sorted((REPO / "examples").glob("*.py"))
# The framework each example needs beyond numpy.
NEEDS = {"torch_example.py": "torch", "jax_example.py": "jax", "transformers_example.py": "transformers"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path):
    need = NEEDS.get(path.name)
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"{need} is not installed")
    args = [sys.executable, str(path)]
    ckpt = golden_set_dir("kda-mini")
    if path.name == "numpy_example.py" and ckpt.exists():
        args.append(str(ckpt))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert r.returncode == 0, f"{path.name} failed:\n{r.stdout}\n{r.stderr}"
    assert r.stdout.rstrip().endswith("ok"), r.stdout


def test_examples_present():
    names = {p.name for p in EXAMPLES}
    assert {"numpy_example.py", "torch_example.py"} <= names
