#!/usr/bin/env bash
# The VM harness (issue 27, "two real kernels"): boots two QEMU guests, each
# a real Linux kernel with the CXL and DAX drivers, sharing ONE CXL type-3
# memory device (the same host file backs both), and runs a scenario
# (tests/vm/scenario_*.sh, functions role_a and role_b) in each against
# dax:///dev/dax0.0 with the build's cxlrt CLI. Fails on any scenario
# failure, printing both guests' serial logs; every wait has a deadline and
# a hung guest is killed and reported.
#
# Usage: tests/vm/run_vm.sh BUILD_DIR SCENARIO_FILE [SECONDS]
# Needs: qemu-system-x86_64, busybox (static), kmod, ndctl (cxl, ndctl), and
# the Debian kernel that scripts/install-deps.sh extracts into
# ${CXLRT_VM_KERNEL_DIR:-/var/cache/cxlrt-vm/kernel}. Without them it says
# why and exits 77 (skipped), or 1 under CI=true.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
scenario=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
budget=${3:-150}
name=$(basename "$scenario" .sh)
kdir=${CXLRT_VM_KERNEL_DIR:-/var/cache/cxlrt-vm/kernel}

missing() {
  echo "vm $name skipped: $*. Install with scripts/install-deps.sh."
  if [[ "${CI:-}" =~ ^([Tt][Rr][Uu][Ee]|1)$ ]]; then
    echo "(A failure, not a skip, because CI=true.)"
    exit 1
  fi
  exit 77
}
qemu=$(command -v qemu-system-x86_64) || missing "no qemu-system-x86_64"
busybox=$(command -v busybox) || missing "no busybox"
readelf -l "$busybox" 2>/dev/null | grep -q "INTERP" && missing "busybox is not static (busybox-static)"
command -v modprobe >/dev/null || missing "no modprobe (kmod)"
command -v cxl >/dev/null && command -v ndctl >/dev/null || missing "no cxl/ndctl (ndctl)"
vmlinuz=$(ls "$kdir"/boot/vmlinuz-* 2>/dev/null | head -1)
[[ -n "$vmlinuz" ]] || missing "no kernel in $kdir/boot"
kver=${vmlinuz##*/vmlinuz-}
[[ -f "$kdir/lib/modules/$kver/modules.dep" ]] || missing "no modules.dep in $kdir/lib/modules/$kver"
cxlrt=$build/bin/cxlrt
[[ -x "$cxlrt" ]] || { echo "vm $name: no $cxlrt (build the cxlrt_cli target)"; exit 1; }
for helper in vm_lock_add vm_kv_writer; do
  grep -q "\$$(tr a-z A-Z <<<"${helper#vm_}")" "$scenario" || continue
  [[ -x "$build/bin/$helper" ]] || { echo "vm $name: no $build/bin/$helper (build the $helper target)"; exit 1; }
done

work=$build/vm/$name
rm -rf "$work"
mkdir -p "$work/out" "$work/initramfs/mod" "$work/initramfs/bin"
for d in proc sys dev newroot; do mkdir -p "$work/initramfs/$d"; done

# The initramfs: static busybox, the 9p/virtio modules, /init.
: >"$work/initramfs/modules.list"
for m in virtio_pci 9pnet_virtio 9p; do
  modprobe -d "$kdir" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  cp "$ko" "$work/initramfs/mod/"
  basename "$ko" >>"$work/initramfs/modules.list"
done
cp "$busybox" "$work/initramfs/bin/busybox"
cp "$here/guest_init.sh" "$work/initramfs/init"
chmod +x "$work/initramfs/init"
(cd "$work/initramfs" && find . | "$busybox" cpio -o -H newc 2>/dev/null | gzip -1) >"$work/initrd.gz"

cat >"$work/out/env.sh" <<ENV
CXLRT_VM_KERNEL_DIR=$kdir
KVER=$kver
CXLRT=$cxlrt
SCENARIO=$scenario
LOCK_ADD=$(find "$build" -name vm_lock_add -type f -perm -u+x | head -1)
KV_WRITER=$(find "$build" -name vm_kv_writer -type f -perm -u+x | head -1)
export CXLRT_LOG_LEVEL=\${CXLRT_LOG_LEVEL:-warning}
${CXLRT_VM_GUEST_ENV:-}
ENV

# One CXL memdev's backing, shared by both guests; a label area per guest.
truncate -s 256M "$work/cxl.raw"
accel=tcg
[[ "${CXLRT_VM_ACCEL:-}" == kvm ]] && accel=kvm
# launch ROLE [BOOT]: boots guest ROLE; BOOT > 1 boots it again (the same
# machine-id, hostname and label file; a new kernel boot, so a new boot id),
# its serial log in ROLE.BOOT.serial.
launch() {
  local role=$1 boot=${2:-1} serial=$1
  ((boot > 1)) && serial=$role.$boot
  "$qemu" -M q35,cxl=on,cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G -accel "$accel" \
    -m 1G,slots=2,maxmem=8G -smp 1 -display none -no-reboot \
    -kernel "$vmlinuz" -initrd "$work/initrd.gz" \
    -append "console=ttyS0 quiet panic=-1 cxlrt_vm.role=$role cxlrt_vm.boot=$boot cxlrt_vm.stage2=$here/guest_stage2.sh" \
    -serial "file:$work/$serial.serial" -monitor "unix:$work/$role.monitor,server,nowait" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev local,id=vmout,path="$work/out",security_model=none,multidevs=remap \
    -device virtio-9p-pci,fsdev=vmout,mount_tag=vmout \
    -object memory-backend-file,id=cxl-mem,share=on,mem-path="$work/cxl.raw",size=256M \
    -object memory-backend-file,id=cxl-lsa,share=on,mem-path="$work/lsa-$role.raw",size=1M \
    -device pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1 \
    -device cxl-rp,port=0,bus=cxl.1,id=rp0,chassis=0,slot=2 \
    -device cxl-rp,port=1,bus=cxl.1,id=rp1,chassis=0,slot=3 \
    -device cxl-type3,bus=rp0,memdev=cxl-mem,lsa=cxl-lsa,id=cxl-pmem0,sn=0x1234 \
    >"$work/$serial.qemu.log" 2>&1 &
  pid[$role]=$!
}
start=$SECONDS
declare -A pid
for role in a b; do
  truncate -s 1M "$work/lsa-$role.raw"
  launch "$role"
done

# A guest asks for a QEMU monitor command (fault scenarios: stop, cont,
# quit) by writing it to out/mon.<role>.<n>; done, it becomes .done.
serve_monitor() {
  local req role
  for req in "$work"/out/mon.*; do
    [[ -f "$req" && "$req" != *.done && "$req" != *.tmp ]] || continue
    role=${req#"$work"/out/mon.}; role=${role%%.*}
    if [[ "$(cat "$req")" == boot ]]; then
      # Boot the guest again once its QEMU has ended (after a quit).
      local deadline=$((SECONDS + 10))
      while kill -0 "${pid[$role]}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
      wait "${pid[$role]}" 2>/dev/null
      rm -f "$work/out/$role.rc"
      boots[$role]=$((${boots[$role]:-1} + 1))
      launch "$role" "${boots[$role]}"
      echo "vm $name: guest $role booted again (boot ${boots[$role]}) at $((SECONDS - start))s"
      mv "$req" "$req.done"
      continue
    fi
    python3 - "$work/$role.monitor" "$(cat "$req")" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
time.sleep(0.2); s.sendall((sys.argv[2] + "\n").encode()); time.sleep(0.3); s.close()
PY
    echo "vm $name: monitor of guest $role: $(cat "$req") at $((SECONDS - start))s ($(date -u +%T.%N | cut -c1-12))"
    # A guest quit on purpose has done its part (its scenario ends there).
    [[ "$(cat "$req")" == quit ]] && echo 0 >"$work/out/$role.rc"
    mv "$req" "$req.done"
  done
}

declare -A boots
deadline=$((SECONDS + budget))
hung=()
# Serve monitor requests until both guests have ended (a guest may be booted
# again after it ended) or the budget is spent.
while ((SECONDS < deadline)); do
  serve_monitor
  # A guest whose scenario failed ends the run (the other may wait for it).
  for role in a b; do
    rc=$(cat "$work/out/$role.rc" 2>/dev/null) && [[ -n "$rc" && "$rc" != 0 ]] && break 2
  done
  kill -0 "${pid[a]}" 2>/dev/null || kill -0 "${pid[b]}" 2>/dev/null || break
  sleep 0.5
done
serve_monitor
for role in a b; do
  if kill -0 "${pid[$role]}" 2>/dev/null; then
    hung+=("$role")
    kill "${pid[$role]}" 2>/dev/null
  fi
  wait "${pid[$role]}" 2>/dev/null
done
elapsed=$((SECONDS - start))

status=0
for role in a b; do
  rc=$(cat "$work/out/$role.rc" 2>/dev/null || echo none)
  if [[ " ${hung[*]} " == *" $role "* ]]; then
    echo "vm $name: guest $role still running after ${elapsed}s (budget ${budget}s) and was killed"; status=1
  elif [[ "$rc" != 0 ]]; then
    echo "vm $name: guest $role scenario status: $rc"; status=1
  fi
done
if ((status != 0)); then
  for f in "$work"/*.serial; do
    s=$(basename "$f" .serial)
    echo "===== guest $s: qemu ($work/$s.qemu.log)"; cat "$work/$s.qemu.log"
    echo "===== guest $s: serial ($f)"; cat "$f"
  done
  echo "vm $name: FAILED after ${elapsed}s"
  exit 1
fi
for f in "$work"/*.serial; do
  echo "===== guest $(basename "$f" .serial)"; grep "cxlrt-vm" "$f"
done
echo "vm $name: passed in ${elapsed}s (two guests, $accel)"
