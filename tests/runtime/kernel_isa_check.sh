#!/bin/bash
# Usage: kernel_isa_check.sh ARCHIVE...
# The machine code of cxlrt's libraries uses AVX (VEX/EVEX instructions,
# ymm/zmm/opmask registers) only inside the kernels of a CPU level above
# the baseline (cxlrt/runtime/cpu_features.h), which run only once the level was
# chosen from cpuid and xgetbv. Anything else runs on every x86-64 CPU,
# so an instruction set leaking into it (a target attribute on the wrong
# function, a -march flag) fails here on any machine, not only as a SIGILL
# on a CPU without it. AVX-512 registers appear only in the avx512 kernels.
set -euo pipefail
# Kernels of a level above baseline, by their (demangled) function names.
avx2_kernels='::(ReduceAvx2|CopyAvx2)\('
avx512_kernels='::ReduceAvx512\('
fail=0
for archive in "$@"; do
  out=$(objdump -d --no-show-raw-insn -C "$archive" | awk -v a2="$avx2_kernels" -v a5="$avx512_kernels" '
    /^[0-9a-f]+ <.*>:$/ { fn = $0; level = (fn ~ a5) ? 2 : (fn ~ a2) ? 1 : 0; next }
    /^ +[0-9a-f]+:\t/ {
      split($0, parts, "\t"); insn = parts[2]
      avx512 = insn ~ /%zmm|%k[0-7]/ || insn ~ /\{%k[0-7]\}/
      avx = avx512 || insn ~ /%ymm/ || insn ~ /^v[a-z0-9]+ /
      if ((avx512 && level < 2) || (avx && level < 1)) {
        if (!(fn in seen)) { print fn; seen[fn] = 1 }
        print "    " insn
        bad++
      }
    }
    END { exit bad > 0 }') || {
    echo "$archive: AVX outside the kernels of its level:"
    head -40 <<<"$out"
    fail=1
  }
done
if [[ $fail == 0 ]]; then
  echo "no AVX outside the avx2/avx512 kernels in: $*"
fi
exit $fail
