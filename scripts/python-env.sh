#!/usr/bin/env bash
# The Python environment of the tests: a venv outside the clone, made with the
# system python3, holding kda built from this tree with its extras (jax, torch,
# fla, transformers) and pytest. Prints the venv's directory.
#
#   KDA_VENV   the venv (default ${XDG_CACHE_HOME:-$HOME/.cache}/kda/venv)
#
# The build tree (build-py/, see pyproject.toml) persists, so a reinstall
# rebuilds only what changed; it therefore builds without pip's isolation, with
# the build requirements of pyproject.toml installed into the venv itself.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KDA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kda/venv}
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
fi
mapfile -t build_requires < <("$venv/bin/python" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))')
"$venv/bin/python" -m pip install -q "${build_requires[@]}" pytest >&2
"$venv/bin/python" -m pip install -q --no-build-isolation ".[jax,torch,fla,transformers]" >&2
echo "$venv"
