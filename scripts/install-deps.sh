#!/usr/bin/env bash
# Installs every build and test dependency of cxlrt: Debian 12 packages
# (apt-get), and into the project's venv (.venv, made here with access to
# Debian's Python packages) the PyPI packages the Python side's tests need:
# torch, for the torch.distributed backend, and the frameworks for the
# connector tests. Ends by running each import the tests need
# (tests/python/probes.txt), failing, saying which, if one does not work.
# Idempotent: what is present is skipped, so a second run is quick. Must run
# as root (or with sudo).
# Downloads nothing but Debian and PyPI packages.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ninja-build ccache
  libabsl-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libmimalloc-dev
  libnuma-dev numactl
  libhwloc-dev hwloc
  libpmem2-dev
  libcli11-dev
  openmpi-bin libopenmpi-dev
  nlohmann-json3-dev
  libcpp-httplib-dev prometheus
  libncurses-dev tmux
  python3 python3-dev python3-venv pybind11-dev python3-numpy python3-pytest python3-hypothesis
  python3-matplotlib
  spin
  clang libclang-rt-14-dev llvm
  clang-format
  qemu-system-x86 ndctl busybox-static kmod
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
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
fi

# The guest kernel of the VM harness (tests/vm/run_vm.sh): the Debian
# kernel package that linux-image-amd64 points at, downloaded (not
# installed: nothing goes into /boot) and extracted into /var/cache/cxlrt-vm
# (CXLRT_VM_KERNEL_DIR overrides; the harness reads the same variable), with
# its modules.dep. Skipped when an extracted kernel is already there.
VM_KERNEL_DIR="${CXLRT_VM_KERNEL_DIR:-/var/cache/cxlrt-vm/kernel}"
if ! ls "$VM_KERNEL_DIR"/lib/modules/*/modules.dep >/dev/null 2>&1; then
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [[ -z "$kpkg" ]]; then
    echo "install-deps: cannot find the kernel package of linux-image-amd64" >&2; exit 1
  fi
  echo "install-deps: extracting $kpkg into $VM_KERNEL_DIR (VM harness guest kernel)"
  tmp=$(mktemp -d)
  (cd "$tmp" && chmod 777 . && apt-get download -q "$kpkg" >/dev/null)
  mkdir -p "$VM_KERNEL_DIR"
  dpkg-deb -x "$tmp"/"$kpkg"_*.deb "$VM_KERNEL_DIR"
  rm -rf "$tmp"
  depmod -b "$VM_KERNEL_DIR" "${kpkg#linux-image-}"
fi

# The project's venv, on Debian's interpreter (the one the extension is
# built for) and seeing its packages (numpy, pytest); torch from PyPI
# (the standard wheel, about 5.5 GB with its CUDA libraries; runs on CPU).
TORCH_VERSION=2.15.0
# CXLRT_VENV puts it elsewhere (a scratch venv, to check on a clean one what
# this script installs is enough for the probes in tests/CMakeLists.txt).
VENV="${CXLRT_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}"
# pip, quiet. The frameworks go in without their dependencies (--no-deps,
# below), so pip's resolver reports, at each later install, the pins they
# declare and this venv does not meet (torch's version, GPU packages): some
# hundred lines that are expected. They go to a log, shown only when pip
# fails; the import probes at the end check what the tests need.
PIP_LOG="$VENV/pip-install.log"
pip_install() {
  if ! "$VENV/bin/pip" install -q --disable-pip-version-check "$@" >>"$PIP_LOG" 2>&1; then
    tail -n 30 "$PIP_LOG" >&2
    echo "install-deps: pip install $* failed (the whole log: $PIP_LOG)" >&2
    return 1
  fi
}
if [[ ! -x "$VENV/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
if [[ "$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" \
      != "$TORCH_VERSION" ]]; then
  echo "install-deps: installing torch $TORCH_VERSION into $VENV (PyPI)"
  pip_install "torch==$TORCH_VERSION"
fi
# What the frameworks' import chains below need and their --no-deps installs
# leave out (a fresh venv has none of them): requests (SGLang's and
# LMCache's utilities), urllib3 (vLLM's), pillow (SGLang's multimodal
# utilities, imported by its storage modules).
if ! "$VENV/bin/python" -c 'import requests, urllib3, PIL' 2>/dev/null; then
  pip_install requests urllib3 pillow
fi
# SGLang, for the HiCache connector's tests through its own backend factory:
# without its dependencies (its GPU kernels and model stack), plus the pure
# Python ones its storage modules import.
SGLANG_VERSION=0.5.23
if [[ "$("$VENV/bin/python" -c 'import sglang.version as v; print(v.__version__)' 2>/dev/null)" \
      != "$SGLANG_VERSION" ]]; then
  echo "install-deps: installing sglang $SGLANG_VERSION into $VENV (PyPI, without its dependencies)"
  pip_install --no-deps "sglang==$SGLANG_VERSION"
fi
# LMCache, for its connector's tests through its native_plugin L2 adapter,
# the same way (its CUDA kernels are not needed on CPU).
LMCACHE_VERSION=0.5.6
if [[ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("lmcache"))' \
        2>/dev/null)" != "$LMCACHE_VERSION" ]]; then
  echo "install-deps: installing lmcache $LMCACHE_VERSION into $VENV (PyPI, without its dependencies)"
  pip_install --no-deps "lmcache==$LMCACHE_VERSION"
fi
if ! "$VENV/bin/python" -c \
    'import lmcache.v1.distributed.l2_adapters.native_plugin_l2_adapter' 2>/dev/null; then
  pip_install numba sortedcontainers \
    prometheus_client py-cpuinfo cachetools msgspec pyzmq
fi
# Its storage manager and L2 metric subscribers (lmcache_connector_test
# reads LMCache's own lmcache_mp.l2_* metrics) need OpenTelemetry, at the
# versions LMCache asks for.
if ! "$VENV/bin/python" -c \
    'import lmcache.v1.distributed.storage_manager, opentelemetry.sdk.metrics' 2>/dev/null; then
  pip_install "opentelemetry-api>=1.20.0,<=1.40.0" \
    "opentelemetry-sdk>=1.20.0,<=1.40.0"
fi
if ! "$VENV/bin/python" -c 'import sglang.srt.mem_cache.storage.backend_factory' 2>/dev/null; then
  pip_install orjson pybase64 starlette msgspec \
    pydantic pyzmq tqdm ipython aiohttp
fi
# vLLM, for its KV connector's tests through its own v1 Scheduler and
# connector factory (CPU device config, no model weights): without its
# dependencies (its GPU kernels, and a torch pin of its own; the scheduler
# and connector code run on the torch above), plus the pure-Python ones its
# scheduler and config modules import, at vLLM's own version bounds.
VLLM_VERSION=0.33.0
if [[ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' \
        2>/dev/null)" != "$VLLM_VERSION" ]]; then
  echo "install-deps: installing vllm $VLLM_VERSION into $VENV (PyPI, without its dependencies)"
  pip_install --no-deps "vllm==$VLLM_VERSION"
fi
if ! "$VENV/bin/python" -c 'import vllm.v1.core.sched.scheduler, vllm.model_executor.models.llama' \
    2>/dev/null; then
  pip_install regex cbor2 "transformers==5.19.0" \
    openai-harmony openai cloudpickle uvloop "xgrammar==0.2.8" "fastapi>=0.133,<0.137" \
    partial-json-parser "llguidance>=1.7,<1.8" einops
fi
# NIXL, for the CXLRT backend plugin's tests and benchmark (docs/nixl.md):
# the CUDA 13 build (the torch above is CUDA 13; it runs without a GPU)
# and the `nixl` front package, without dependencies (the front package
# would pull the CUDA 12 build too; torch and numpy are here already).
NIXL_VERSION=1.5.1
if [[ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("nixl-cu13"), m.version("nixl"))' \
        2>/dev/null)" != "$NIXL_VERSION $NIXL_VERSION" ]]; then
  echo "install-deps: installing nixl $NIXL_VERSION (nixl-cu13) into $VENV (PyPI, without its dependencies)"
  pip_install --no-deps "nixl==$NIXL_VERSION" \
    "nixl-cu13==$NIXL_VERSION"
fi
# mypy, for its stubtest: python_stubs_test checks python/cxlrt/_cxlrt.pyi
# against the extension module.
MYPY_VERSION=2.4.1
if [[ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mypy"))' \
        2>/dev/null)" != "$MYPY_VERSION" ]]; then
  echo "install-deps: installing mypy $MYPY_VERSION into $VENV (PyPI)"
  pip_install "mypy==$MYPY_VERSION"
fi
# Each import the tests need (tests/python/probes.txt, what tests/CMakeLists.txt
# probes): one that fails here would make the tests that need it a configure
# error (CI, scripts/test.sh) or a skip, so it fails the install instead,
# saying which and why.
failed=0
while read -r key code; do
  [[ -z $key || $key == \#* ]] && continue
  if ! err=$("$VENV/bin/python" -c "$code" 2>&1 >/dev/null); then
    echo "install-deps: $key: \`$code\` fails in $VENV: $(tail -n 1 <<<"$err")" >&2
    failed=1
  fi
done <"$(cd "$(dirname "$0")/.." && pwd)/tests/python/probes.txt"
exit "$failed"
