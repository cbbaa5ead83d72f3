#!/usr/bin/env bash
# The GPU data path on a machine with a GPU, in one run (docs/gpu.md):
#   1. builds with CUDA (Release), or takes programs built by
#      scripts/gpu-prebuild.sh (--prebuilt DIR: DIR/bin and DIR/lib) where
#      the machine cannot install cxlrt's Debian dependencies;
#   2. the CUDA tests (several emulated hosts as processes sharing the GPU,
#      each with its own context), the Python side's GPU tests
#      (python/tests/gpu: CUDA tensors, the torch backend), and cxlrt doctor;
#   3. the benchmarks: pool <-> device DMA beside pinned cudaMemcpy and the
#      device-to-device rate (the limits); the latency of a hop through the
#      pool per way of ringing a doorbell; KV BatchPut/BatchGet of 16 KiB-2
#      MiB blocks from and into device memory; 2- and 4-rank all-reduce and
#      all-gather on device buffers (busbw, #wrong) under MPS, with the
#      staged/mapped reductions, chunk sizes and pipeline depths side by
#      side; 2-rank Send/Recv of device buffers at two channel sizes.
# Everything goes to $OUT (default ./gpu-out); a short summary is printed
# last. Each step has its own time limit, so one hang does not cost the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
LOG=$(mktemp -d)  # every step's log; $OUT gets an archive and a few tables
prebuilt=""
if [[ ${1:-} == --prebuilt ]]; then prebuilt=$2; fi

if [[ -n $prebuilt ]]; then
  bin=$(cd "$prebuilt/bin" && pwd)
  export LD_LIBRARY_PATH="$(cd "$prebuilt/lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  jobs=$(nproc 2>/dev/null || echo 16)
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCXLRT_PYTHON=ON >"$OUT/build.log" 2>&1 &&
    cmake --build build-gpu -j"$jobs" --target cxlrt_cli gpu_test gpu_api_test _cxlrt \
      cxlrt_shared >>"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
  cp "$OUT/build.log" "$LOG/"
  bin=$PWD/build-gpu/bin
  pypath=$PWD/build-gpu/python
fi
if [[ -n $prebuilt ]]; then
  # The Python extension for this machine's python3 (gpu-prebuild.sh's note).
  pypath=$(cd "$prebuilt/py" && pwd)
  ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  # pybind11's headers: its package's, else the copy inside torch.
  inc=$(python3 -m pybind11 --includes 2>/dev/null ||
        python3 -c 'import os, sysconfig, torch
print("-I" + sysconfig.get_paths()["include"], "-I" + os.path.join(os.path.dirname(torch.__file__), "include"))')
  [[ -f $pypath/cxlrt/_cxlrt$ext ]] ||
    g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden $inc \
      -I"$pypath/cxlrt/include" -I"$pypath" "$pypath"/python/csrc/*.cc \
      -L"$pypath/cxlrt/lib" -lcxlrt \
      -Wl,-rpath,"$pypath/cxlrt/lib" -o "$pypath/cxlrt/_cxlrt$ext" >"$OUT/python-build.log" 2>&1 ||
    { echo "(the Python extension did not build: $OUT/python-build.log)"; tail -5 "$OUT/python-build.log"; }
fi

summary=()
step() {  # step NAME SECONDS COMMAND...: runs it, logs to $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$LOG/$name.txt" 2>&1
  local rc=$?
  summary+=("$(printf '%-16s rc=%-3s %4ss' "$name" "$rc" $((SECONDS - t0)))")
  echo "== $name: rc=$rc ($((SECONDS - t0)) s)"
  tail -4 "$LOG/$name.txt"
  tar -C "$LOG" -czf "$OUT/all-logs.tgz" .  # kept current: a run cut short still reports
}

nvidia-smi >"$LOG/nvidia-smi.txt" 2>&1 || true
step doctor 30 "$bin/cxlrt" doctor
step gpu_api_test 30 "$bin/gpu_api_test" --gtest_brief=1
step gpu_test 240 "$bin/gpu_test" --gtest_brief=1
# The Python side: CUDA tensors through the API, KV paged caches in GPU
# memory, and the torch backend's calls on CUDA tensors against Gloo.
# The GPU image has its own torch: the backend compiles there (CXLRT_TORCH_JIT).
step python_gpu 420 env PYTHONPATH="$pypath" TORCH_EXTENSIONS_DIR="$LOG/torch_ext" CXLRT_TORCH_JIT=1 \
  python3 -m pytest -q -p no:cacheprovider python/tests/gpu
step dma 60 "$bin/cxlrt" bench dma -b 64K -e 256M
step doorbell 90 "$bin/cxlrt" bench doorbell -b 8 -e 1M -f 8
step kv 90 "$bin/cxlrt" bench kv --device --hosts 2 --reps 3 --working-set 512M --batch 32
step kv_kernel 90 env CXLRT_CUDA_KV_COPY=kernel "$bin/cxlrt" bench kv --device --hosts 2 --reps 3 \
  --working-set 512M --batch 32

# The emulated hosts of a collective are processes sharing this one GPU.
# Without MPS the GPU time-slices their contexts (each switch costs more
# than a chunk's kernel), which no rack of one GPU per host has: the
# collective benchmarks run under an MPS server started here and stopped
# after (a user-space daemon; the GPU's settings are left alone). One
# all-reduce without it shows the difference.
step allreduce_2_nomps 60 "$bin/cxlrt" bench allreduce --device --ranks 2 -b 1M -e 64M -f 8 -n 10 -w 3
export CUDA_MPS_PIPE_DIRECTORY=$LOG/mps-pipe CUDA_MPS_LOG_DIRECTORY=$LOG/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if nvidia-cuda-mps-control -d; then mps=1; else mps=0; echo "(no MPS: time-sliced)"; fi
coll=(-b 64K -e 256M -f 4 -n 10 -w 3)
for r in 2 4; do
  step "allreduce_$r" 60 "$bin/cxlrt" bench allreduce --device --ranks "$r" "${coll[@]}"
  step "allgather_$r" 60 "$bin/cxlrt" bench allgather --device --ranks "$r" "${coll[@]}"
done
# Send/Recv: the channel ring with the default channels (1 MiB: chunks of
# 256 KiB) and with 16 MiB ones (chunks of 4 MiB).
step sendrecv_2 60 "$bin/cxlrt" bench sendrecv --device --ranks 2 "${coll[@]}"
step sendrecv_2_p2p16M 60 env CXLRT_COMM_P2P_BYTES=16777216 "$bin/cxlrt" bench sendrecv --device \
  --ranks 2 "${coll[@]}"
step allreduce_2_mapped 60 env CXLRT_CUDA_REDUCE=mapped "$bin/cxlrt" bench allreduce --device --ranks 2 "${coll[@]}"
for c in 1048576 2097152 4194304; do
  step "allreduce_2_chunk$c" 60 env CXLRT_COMM_CHUNK_BYTES=$c "$bin/cxlrt" bench allreduce --device \
    --ranks 2 -b 4M -e 256M -f 4 -n 10 -w 3
done
# 4 ranks: deeper pipelines and larger chunks (slots of 8 MiB) against the
# default, at the sizes where the target is read.
big=(--ranks 4 -b 16M -e 256M -f 4 -n 10 -w 3)
step allreduce_4_depth6 60 env CXLRT_COMM_DEPTH=6 "$bin/cxlrt" bench allreduce --device "${big[@]}"
step allreduce_4_depth8 60 env CXLRT_COMM_DEPTH=8 "$bin/cxlrt" bench allreduce --device "${big[@]}"
step allreduce_4_chunk8M 60 env CXLRT_COMM_SLOT_BYTES=8388608 CXLRT_COMM_CHUNK_BYTES=8388608 \
  "$bin/cxlrt" bench allreduce --device "${big[@]}"
# Post lines and flags written by the copy engine behind the copies
# (CXLRT_CUDA_DOORBELL=copy) against the host's, at every size.
for r in 2 4; do
  step "allreduce_${r}_copybell" 60 env CXLRT_CUDA_DOORBELL=copy "$bin/cxlrt" bench allreduce \
    --device --ranks "$r" "${coll[@]}"
done
[[ $mps == 1 ]] && echo quit | nvidia-cuda-mps-control
step allreduce_host2 40 "$bin/cxlrt" bench allreduce --ranks 2 "${coll[@]}"

# $OUT: the logs in one archive, and the tables read most beside it.
tar -C "$LOG" -czf "$OUT/all-logs.tgz" .
cp "$LOG/dma.txt" "$LOG/doorbell.txt" "$LOG/kv.txt" "$LOG/gpu_test.txt" "$OUT/" 2>/dev/null
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
echo "== dma"; tail -7 "$LOG/dma.txt"
echo "== kv"; tail -9 "$LOG/kv.txt"
echo "== kv_kernel"; tail -9 "$LOG/kv_kernel.txt"
echo "== doorbell"; grep -v '^# cxlrt' "$LOG/doorbell.txt" | tail -9
for f in allreduce_2_nomps allreduce_2 allreduce_4 allgather_2 allgather_4 allreduce_2_mapped \
  allreduce_2_chunk1048576 allreduce_2_chunk2097152 allreduce_2_chunk4194304 \
  allreduce_4_depth6 allreduce_4_depth8 allreduce_4_chunk8M allreduce_2_copybell \
  allreduce_4_copybell sendrecv_2 sendrecv_2_p2p16M allreduce_host2; do
  echo "== $f"; grep -v '^#' "$LOG/$f.txt" | grep -v '^ *device' | tail -7 | cut -c1-112
done
echo "== gpu_test"; grep -E "FAILED|PASSED|SKIPPED|Failure|rank [0-9]" "$LOG/gpu_test.txt" | head -20
echo "== python_gpu"; grep -E "passed|failed|skipped|Error|assert" "$LOG/python_gpu.txt" | head -12
