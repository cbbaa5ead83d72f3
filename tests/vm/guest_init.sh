#!/bin/busybox sh
# /init of the VM harness's initramfs (tests/vm/run_vm.sh builds it).
# Loads the 9p/virtio modules, mounts the HOST's / read-only over 9p and
# chroots into it, so the guest runs the build's programs and the host's
# ndctl/cxl tools exactly as they are on the host. The kernel command line
# carries cxlrt_vm.stage2=PATH (run in the chroot) and cxlrt_vm.role=NAME.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.list); do insmod "/mod/$m" || echo "cxlrt-vm: insmod $m failed"; done
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^cxlrt_vm\.$1=//p"; }
role=$(arg role)
stage2=$(arg stage2)
mkdir -p /newroot
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /newroot; then
  echo "cxlrt-vm: cannot mount the host's / over 9p"; echo o >/proc/sysrq-trigger; sleep 10
fi
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mount -t tmpfs tmp /newroot/tmp
mount -t tmpfs run /newroot/run
mkdir -p /newroot/dev/shm && mount -t tmpfs shm /newroot/dev/shm
mkdir -p /newroot/tmp/vmout
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 vmout /newroot/tmp/vmout
# Each guest is its own machine: its own machine-id and hostname.
echo "$(echo "cxlrt-vm-$role" | md5sum | cut -c1-32)" >/newroot/tmp/machine-id
mount -o bind /newroot/tmp/machine-id /newroot/etc/machine-id
hostname "vm-$role"
echo "cxlrt-vm: guest $role up, running $stage2"
chroot /newroot /bin/bash "$stage2" "$role"
echo "cxlrt-vm: guest $role stage2 exited $?"
sync
echo o >/proc/sysrq-trigger
sleep 10
