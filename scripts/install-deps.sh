#!/usr/bin/env bash
# Installs every build and test dependency of cxlrt from Debian 12 packages.
# Idempotent: packages already present are skipped, so a second run is quick.
# Must run as root (or with sudo available). Downloads nothing but Debian packages.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libabsl-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libmimalloc-dev
  libnuma-dev numactl
  libhwloc-dev hwloc
  libpmem2-dev
  libcli11-dev
  nlohmann-json3-dev
  python3 python3-dev pybind11-dev python3-numpy python3-pytest
  spin
  clang libclang-rt-14-dev llvm
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO=sudo; else
    echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
