#!/usr/bin/env bash
# Installs the Debian 12 packages the build, tests and lint need. Idempotent
# and quiet when everything is already there.
set -euo pipefail

packages=(build-essential cmake g++ libdnnl-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev googletest libbenchmark-dev clang-format clang-tidy cppcheck pre-commit git python3-numpy
  libopenmpi-dev openmpi-bin)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
