#!/bin/bash
# Second stage of a VM harness guest, run in the chroot of the host's /
# (tests/vm/guest_init.sh). Loads the CXL and DAX drivers from the
# extracted kernel, then runs the scenario (a file that defines role_a and
# role_b), writing its exit status to /tmp/vmout/<role>.rc for the host.
set -o pipefail
role=$1
out=/tmp/vmout
source "$out/env.sh"  # CXLRT_VM_KERNEL_DIR, KVER, CXLRT, SCENARIO, knobs
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
# An empty config: the host's /etc/modprobe.d runs `ndctl load-keys` as
# libnvdimm's install command, and its nested modprobe lacks -d.
mkdir -p /tmp/modprobe.d
for m in cxl_acpi cxl_pci cxl_mem cxl_pmem libnvdimm nd_pmem device_dax dax_pmem; do
  modprobe -C /tmp/modprobe.d -d "$CXLRT_VM_KERNEL_DIR" -S "$KVER" "$m" || echo "cxlrt-vm: modprobe $m failed"
done
source "$(dirname "$0")/vm_lib.sh"
source "$SCENARIO"
# A guest booted again (run_vm.sh's `boot` request) runs role_<role>_reboot.
boot=$(sed -n 's/.*cxlrt_vm.boot=\([0-9]*\).*/\1/p' /proc/cmdline)
fn=role_$role
((${boot:-1} > 1)) && fn=role_${role}_reboot
rc=0
("$fn") || rc=$?
echo "$rc" >"$out/$role.rc"
echo "cxlrt-vm: role $role finished rc=$rc"
sync
