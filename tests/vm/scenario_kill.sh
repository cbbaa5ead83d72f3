# VM scenario "kill": A's kernel is killed (QEMU monitor `quit`) while ONE
# process in it puts 32 KiB KV entries in a loop (tests/vm/kv_writer.cc; its
# slot is checked attached in `pool info` just before the quit) and a second
# runs an all-reduce loop with B's rank (one rank per kernel), and a third is
# inside ONE put of 64 MiB ("PUT STARTED" printed, not "PUT DONE"). B's all-reduce
# must end with kAborted ("rank 0 ... is dead") within about the lease and
# its margin; B fences A's slots (`pool fence`) and recovers their arenas
# (RecoverDeadHosts), every key A printed as committed reads back
# byte-exact, the interrupted put left no entry and no block (its slot's
# arena empty, 64 MiB allocate again), and the pool checks clean. Then A's guest boots again (a new
# kernel boot, so a new boot id; the same machine-id and hostname), attaches
# with its CXLRT_HOST_ID, takes its slot back, and a put/get works; then it
# is killed again while attached, and boot 3 takes the slot back from boot
# 2, which nobody fenced (docs/membership.md, Reboots).
P=dax:///dev/dax0.0
SIZE=32768
BIG=$((64 << 20))
export CXLRT_WORLD_SIZE=2 CXLRT_POOL=$P
COLL=("bench" "allreduce" -b 4K -e 4K -n 200000 -w 0 -c 1)

role_a() {
  make_dax
  flag a_dax
  wait_flag b_dax
  run "$CXLRT" pool create "$P?size=240M"
  log "boot id $(cat /proc/sys/kernel/random/boot_id)"
  # The writer first, so that it takes host 0's first slot (0), as it must
  # again after the reboot; the all-reduce's rank 0 then takes slot 1.
  # 20 ms apart, so that every key fits the store (it would evict the oldest).
  KV_WRITER_PAUSE_US=20000 CXLRT_HOST_ID=0 "$KV_WRITER" write "$P" 120 "$SIZE" >"$out/a.writer.log" 2>&1 &
  local writer=$!
  local deadline=$((SECONDS + 90))
  until grep -q '^ATTACHED' "$out/a.writer.log"; do
    ((SECONDS < deadline)) || fail "the writer did not attach: $(tail -3 "$out/a.writer.log")"
    sleep 0.2
  done
  CXLRT_RANK=0 CXLRT_HOST_ID=0 "$CXLRT" "${COLL[@]}" >"$out/a.coll.log" 2>&1 &
  until (($(grep -c '^OK' "$out/a.writer.log") >= 20)); do
    ((SECONDS < deadline)) || fail "the writer did not commit 20 puts: $(tail -3 "$out/a.writer.log")"
    kill -0 "$writer" 2>/dev/null || fail "the writer ended early: $(tail -3 "$out/a.writer.log")"
    sleep 0.2
  done
  # Both of A's processes attached (the all-reduce's rank 0 too), then a
  # few seconds of all-reduce rounds before B asks for the kill.
  until (($("$CXLRT" pool info "$P" | awk '$1 == "slot" && $3 == "attached" && $9 == "vm-a"' | wc -l) >= 2)); do
    ((SECONDS < deadline)) || fail "A's all-reduce rank did not attach: $(tail -3 "$out/a.coll.log")"
    sleep 0.5
  done
  sleep 3
  # One large put, through the MMIO window: B asks for the kill while it runs.
  CXLRT_HOST_ID=0 "$KV_WRITER" bigput "$P" "$BIG" big0 >"$out/a.big.log" 2>&1 &
  flag a_running
  sleep 120
  fail "A was not killed"
}

# Boots 2 and 3 of A's guest: the same machine, a new boot each time.
role_a_reboot() {
  make_dax
  local old slot
  log "boot $boot: boot id $(cat /proc/sys/kernel/random/boot_id)"
  old=$(awk '$1 == "ATTACHED" {print $3}' "$out/a.writer.log")
  if ((boot == 2)); then
    # Slot 0 was fenced and recovered by B: free for the taking.
    CXLRT_HOST_ID=0 "$KV_WRITER" write "$P" 2 1024 again >"$out/a2.writer.log" 2>&1 ||
      fail "the writer after the reboot failed: $(tail -3 "$out/a2.writer.log")"
    slot=$(awk '$1 == "ATTACHED" {print $3}' "$out/a2.writer.log")
    log "attached again in slot $slot (before the kill: slot $old)"
    [[ "$slot" == "$old" ]] || fail "after the reboot A took slot $slot, not its slot $old"
    run "$KV_WRITER" verify "$P" "$out/a2.writer.log" 1024 again
    run "$KV_WRITER" verify "$P" "$out/a.writer.log" "$SIZE"
    run "$CXLRT" pool check "$P"
    # Attached again, then killed again; B leaves the slot alone this time.
    KV_WRITER_PAUSE_US=20000 CXLRT_HOST_ID=0 "$KV_WRITER" write "$P" 120 1024 boot2 \
      >"$out/a2b.writer.log" 2>&1 &
    local deadline=$((SECONDS + 90))
    until (($(grep -c '^OK' "$out/a2b.writer.log") >= 20)); do
      ((SECONDS < deadline)) || fail "the boot-2 writer did not commit 20 puts: $(tail -3 "$out/a2b.writer.log")"
      sleep 0.2
    done
    flag a2_running
    sleep 120
    fail "A was not killed again"
  fi
  # Boot 3: slot 0 is still attached by boot 2, which no one fenced. A
  # claim by number waits until its beat stood still for the lease,
  # then takes it at the next epoch (docs/membership.md, Reboots).
  local t0 t1
  read -r t0 _ </proc/uptime
  KV_WRITER_SLOT=$old CXLRT_HOST_ID=0 "$KV_WRITER" write "$P" 2 1024 boot3 >"$out/a3.writer.log" 2>&1 ||
    fail "the writer after the second reboot failed: $(tail -3 "$out/a3.writer.log")"
  read -r t1 _ </proc/uptime
  slot=$(awk '$1 == "ATTACHED" {print $3}' "$out/a3.writer.log")
  log "took slot $slot back from its earlier boot (attach and 2 s of puts: $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') s)"
  [[ "$slot" == "$old" ]] || fail "after the second reboot A took slot $slot, not its slot $old"
  run "$KV_WRITER" verify "$P" "$out/a3.writer.log" 1024 boot3
  run "$KV_WRITER" verify "$P" "$out/a2b.writer.log" 1024 boot2
  run "$CXLRT" pool check "$P"
  flag a3_done
  log "PASS"
}

role_b() {
  wait_flag a_dax
  make_dax
  flag b_dax
  CXLRT_RANK=1 CXLRT_HOST_ID=1 "$CXLRT" "${COLL[@]}" >/tmp/b.coll.log 2>&1 &
  local coll=$!
  wait_flag a_running
  local deadline=$((SECONDS + 90))
  until grep -q '^PUT STARTED' "$out/a.big.log" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "A's big put did not start: $(tail -3 "$out/a.big.log")"
    sleep 0.1
  done
  sleep 0.5
  grep -q '^PUT DONE' "$out/a.big.log" && fail "A's big put ended before the quit: $(tail -1 "$out/a.big.log")"
  local slot info t0 t1 rc n_quit big_slot
  slot=$(awk '$1 == "ATTACHED" {print $3}' "$out/a.writer.log")
  info=$("$CXLRT" pool info "$P")
  grep -E "^ *slot " <<<"$info"
  grep -qE "^ *slot $slot +attached" <<<"$info" || fail "A's writer slot $slot is not attached before the quit"
  kill -0 "$coll" 2>/dev/null || fail "B's all-reduce ended before the quit: $(tail -3 /tmp/b.coll.log)"
  read -r t0 _ </proc/uptime
  monitor a quit
  n_quit=$(grep -c '^OK' "$out/a.writer.log")
  grep -q '^PUT DONE' "$out/a.big.log" && fail "A's big put ended before the kill: $(tail -1 "$out/a.big.log")"
  big_slot=$(awk '$1 == "ATTACHED" {print $3}' "$out/a.big.log")
  log "A killed inside its put of $BIG B (slot $big_slot)"
  log "A killed with $n_quit puts of ${SIZE} B committed (writer in slot $slot)"
  deadline=$((SECONDS + 90))
  while kill -0 "$coll" 2>/dev/null; do
    ((SECONDS < deadline)) || fail "B's all-reduce did not end within 30 s of the kill"
    sleep 0.1
  done
  read -r t1 _ </proc/uptime
  wait "$coll"
  rc=$?
  tail -2 /tmp/b.coll.log
  ((rc != 0)) || fail "B's all-reduce ended normally after its peer was killed"
  grep -q "rank 0 .*dead\|aborted" /tmp/b.coll.log || fail "B's all-reduce failed without saying rank 0 died"
  local took
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}')
  log "B's all-reduce ended aborted $took s after the quit was asked (lease 2 s, dead after 2.5 s + D)"
  awk -v t="$took" 'BEGIN {exit !(t < 8)}' || fail "B's all-reduce took $took s (> 8 s) to abort"
  local s
  for s in $("$CXLRT" pool info "$P" | awk '$1 == "slot" && $3 == "attached" && $9 == "vm-a" {print $2}'); do
    run "$CXLRT" pool fence "$P" "$s"
  done
  local rec
  rec=$("$KV_WRITER" recover "$P" "$slot") || fail "RecoverDeadHosts did not recover slot $slot: $rec"
  log "$rec"
  rec=$("$KV_WRITER" recover "$P" "$big_slot") || fail "RecoverDeadHosts did not recover slot $big_slot: $rec"
  log "$rec"
  run "$CXLRT" pool check "$P"
  run "$KV_WRITER" verify "$P" "$out/a.writer.log" "$SIZE"
  run "$KV_WRITER" bigcheck "$P" "$big_slot" "$BIG" big0
  run "$CXLRT" pool info "$P" | grep -E "hosts|^ *slot"
  monitor a boot
  wait_flag a2_running 120
  run "$CXLRT" pool info "$P" | grep -E "hosts|^ *slot"
  monitor a quit
  monitor a boot
  wait_flag a3_done 120
  run "$CXLRT" pool info "$P" | grep -E "hosts|^ *slot"
  run "$CXLRT" pool check "$P"
  log "PASS"
}
