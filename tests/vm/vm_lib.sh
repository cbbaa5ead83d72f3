# Helpers for VM harness scenarios (sourced by guest_stage2.sh).
# Guests sequence themselves through flag files on the host's 9p share
# ($out); cxlrt itself only ever talks through the pool.
log() { echo "cxlrt-vm[$role] $*"; }
peer=$([[ $role == a ]] && echo b || echo a)
fail() { log "FAIL: $*"; exit 1; }
flag() { : >"$out/flag.$1"; sync; }
# wait_flag NAME [SECONDS]: fails the scenario past the deadline.
wait_flag() {
  local deadline=$((SECONDS + ${2:-120}))
  while [[ ! -e "$out/flag.$1" ]]; do
    ((SECONDS < deadline)) || fail "timed out waiting for flag $1"
    [[ -e "$out/$peer.rc" ]] && fail "guest $peer ended (status $(cat "$out/$peer.rc")) before flag $1"
    sleep 0.2
  done
}
# run CMD...: runs and logs a command, failing the scenario if it fails.
run() {
  log "\$ $*"
  "$@" || fail "'$*' exited $?"
}
# make_dax: region and devdax namespace over the shared memdev -> /dev/dax0.0.
# After a reboot the namespace may come back from the guest's label area by
# itself once the region exists; then it is not created again.
make_dax() {
  run cxl create-region -m -d decoder0.0 -t pmem -w 1 -g 256 mem0 >/dev/null
  local deadline=$((SECONDS + (${boot:-1} > 1 ? 3 : 0)))
  until [[ -c /dev/dax0.0 ]] || ((SECONDS >= deadline)); do sleep 0.2; done
  if [[ -c /dev/dax0.0 ]]; then
    log "dax0.0 came back from the labels"
  elif ((${boot:-1} > 1)); then
    # The namespace came back from the labels, but not as a dax device:
    # reconfigure it in place (its info block is below the pool's 2 MiB).
    log "after the reboot: $(ndctl list -N -r region0 | tr -d '\n ')"
    run ndctl create-namespace -f -e namespace0.0 -m devdax -a 2M --map=mem >/dev/null
  else
    run ndctl create-namespace -r region0 -m devdax -a 2M --map=mem >/dev/null
  fi
  [[ -c /dev/dax0.0 ]] || fail "no /dev/dax0.0 after ndctl create-namespace"
  log "dax0.0: size $(cat /sys/bus/dax/devices/dax0.0/size) align $(cat /sys/bus/dax/devices/dax0.0/align)"
}
# monitor ROLE CMD: has the host send CMD to guest ROLE's QEMU monitor and
# waits (deadline 30 s) until it was sent.
monitor() {
  local req="$out/mon.$1.$RANDOM" deadline=$((SECONDS + 30))
  echo "$2" >"$req.tmp" && mv "$req.tmp" "$req"
  while [[ ! -e "$req.done" ]]; do
    ((SECONDS < deadline)) || fail "the host did not send '$2' to guest $1"
    sleep 0.2
  done
  log "monitor of guest $1: $2"
}
