#!/usr/bin/env bash
# clang-tidy over the project's translation units, using build/compile_commands.json.
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
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$db" --quiet 2>/dev/null
