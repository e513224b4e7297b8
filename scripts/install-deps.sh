#!/usr/bin/env bash
# Installs the Debian 12 packages that the build, tests, fuzzing, lint and
# benchmarks need. Idempotent and quiet when everything is already there.
#
# What is missing is decided by what the build looks for (a command, a CMake
# package config, a header, a library), not by package names alone: a package
# is installed when the file the build needs from it is absent. Recommends are
# never installed, so everything the build needs is named here, including what
# a package only recommends (libdnnl-dev's CMake config requires OpenCL's
# headers and library, which it merely recommends).
#
#   scripts/install-deps.sh            install what is missing
#   scripts/install-deps.sh --list     print every package, one a line
#   scripts/install-deps.sh --check    dry run: resolve every package with
#                                      apt-get --dry-run --no-install-recommends
#                                      and fail if one is unknown
set -euo pipefail

arch_lib=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)

# package | what the build needs from it (a command on PATH, or a path glob)
requirements=(
  # build
  "build-essential|g++"
  "cmake|cmake"
  "ccache|ccache"
  "libdnnl-dev|$arch_lib/cmake/dnnl/dnnl-config.cmake"
  "ocl-icd-opencl-dev|$arch_lib/libOpenCL.so"
  "opencl-c-headers|/usr/include/CL/cl.h"
  "nlohmann-json3-dev|/usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake"
  "libcli11-dev|/usr/include/CLI/CLI.hpp"
  "libopenmpi-dev|$arch_lib/openmpi/include/mpi.h"
  "openmpi-bin|mpirun"
  # tests: GoogleTest, golden-case generation, emulated CPUs, fuzzing
  "libgtest-dev|$arch_lib/cmake/GTest/GTestConfig.cmake"
  "googletest|/usr/src/googletest/CMakeLists.txt"
  "python3|python3"
  "python3-numpy|/usr/lib/python3/dist-packages/numpy/__init__.py"
  "qemu-user|qemu-x86_64"
  "clang|clang++"
  "libclang-rt-dev|/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a"
  "libomp-dev|/usr/lib/llvm-*/lib/clang/*/include/omp.h"
  # the Python package (pyproject.toml; scripts/python-env.sh builds it into a venv for the tests)
  "python3-dev|/usr/include/python3*/Python.h"
  "python3-venv|/usr/lib/python3*/ensurepip/__init__.py"
  "ninja-build|ninja"
  # benchmarks
  "libbenchmark-dev|$arch_lib/cmake/benchmark/benchmarkConfig.cmake"
  # lint
  "clang-format|clang-format"
  "clang-tidy|clang-tidy"
  "cppcheck|cppcheck"
  "pre-commit|pre-commit"
  "git|git"
)

all_packages() {
  for r in "${requirements[@]}"; do echo "${r%%|*}"; done
}

present() {  # a command name, or a path glob that matches an existing file
  local need=$1
  if [[ $need == /* ]]; then
    compgen -G "$need" >/dev/null
  else
    command -v "$need" >/dev/null 2>&1
  fi
}

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

case "${1:-}" in
  --list)
    all_packages
    exit 0
    ;;
  --check)
    mapfile -t pkgs < <(all_packages)
    $SUDO apt-get update -qq
    if ! out=$(apt-get install --dry-run --no-install-recommends "${pkgs[@]}" 2>&1); then
      echo "install-deps: the dry run failed:" >&2
      echo "$out" >&2
      exit 1
    fi
    echo "install-deps: all ${#pkgs[@]} packages resolve; $(grep -c '^Inst ' <<<"$out" || true) would be installed"
    exit 0
    ;;
  "") ;;
  *)
    echo "usage: $0 [--list|--check]" >&2
    exit 2
    ;;
esac

missing=()
for r in "${requirements[@]}"; do
  pkg=${r%%|*}
  need=${r#*|}
  present "$need" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Verify by the same probes: a package that installed but did not provide what
# the build needs is an error here, not a confusing CMake failure later.
for r in "${requirements[@]}"; do
  pkg=${r%%|*}
  need=${r#*|}
  if ! present "$need"; then
    echo "install-deps: $pkg is installed but $need is still missing" >&2
    exit 1
  fi
done
