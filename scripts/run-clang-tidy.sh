#!/usr/bin/env bash
# clang-tidy over the project's translation units, using build/compile_commands.json;
# the Python bindings (python/src) with the compile database of the Python build
# tree (build-py/*/, written by pip install / scripts/python-env.sh).
set -euo pipefail
db=${KDA_BUILD_DIR:-build}
if [ ! -f "$db/compile_commands.json" ]; then
  echo "no $db/compile_commands.json: run 'make build' first" >&2
  exit 1
fi
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(git ls-files '*.cc')
fi
lib=()
py=()
for f in "${files[@]}"; do
  if [[ $f == python/* ]]; then py+=("$f"); else lib+=("$f"); fi
done
if [ ${#lib[@]} -gt 0 ]; then
  printf '%s\n' "${lib[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$db" --quiet 2>/dev/null
fi
if [ ${#py[@]} -gt 0 ]; then
  pydb=$(compgen -G "${KDA_PY_BUILD_DIR:-build-py/*}/compile_commands.json" | head -n 1 || true)
  if [ -z "$pydb" ]; then
    echo "no build-py/*/compile_commands.json: run 'make python-env' first" >&2
    exit 1
  fi
  printf '%s\n' "${py[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$(dirname "$pydb")" --quiet 2>/dev/null
fi
