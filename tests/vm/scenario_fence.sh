# VM scenario "fence": A's kernel is paused (QEMU monitor `stop`) past its
# lease while it is attached; B fences A's slot (`cxlrt pool fence`, which
# waits the lease and its margin before judging A dead) and the pool checks
# clean; after `cont`, A's next step must fail saying it was fenced, and
# pool check is clean from both kernels.
P=dax:///dev/dax0.0

role_a() {
  make_dax
  flag a_dax
  wait_flag b_dax
  run "$CXLRT" pool create "$P?size=128M"
  "$CXLRT" pool attach "$P" --slot 0 --seconds 60 --interval-ms 200 >/tmp/attach.log 2>&1 &
  local attach=$!
  local deadline=$((SECONDS + 30))
  until grep -q "attached to" /tmp/attach.log; do
    ((SECONDS < deadline)) || fail "pool attach did not attach: $(cat /tmp/attach.log)"
    sleep 0.2
  done
  flag a_attached
  wait "$attach"
  local rc=$?
  tail -3 /tmp/attach.log
  ((rc != 0)) || fail "pool attach ended normally after its slot was fenced"
  grep -q "fenced" /tmp/attach.log || fail "pool attach failed without saying it was fenced"
  log "after cont, A's attach failed saying it was fenced"
  flag a_done
  run "$CXLRT" pool check "$P"
  log "PASS"
}

role_b() {
  wait_flag a_dax
  make_dax
  flag b_dax
  wait_flag a_attached
  monitor a stop
  run "$CXLRT" pool fence "$P" 0
  run "$CXLRT" pool info "$P" | grep -E "hosts|slot 0"
  run "$CXLRT" pool check "$P"
  monitor a cont
  wait_flag a_done 90
  log "PASS"
}
