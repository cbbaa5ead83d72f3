# VM scenario "fence": A's kernel is paused (QEMU monitor `stop`) past its
# lease while a writer in it (tests/vm/kv_writer.cc) keeps putting numbered
# KV keys (and allocating and freeing); B fences the writer's slot
# (`cxlrt pool fence` waits the lease and its margin), recovers its arena
# (the allocator's RecoverDeadHosts, `vm_kv_writer recover`) and the pool
# checks clean; after `cont`, the writer's next call must fail saying it was
# fenced (no put returns OK after the cont), every key it printed as
# committed reads back byte-exact in B, and pool check is clean from both.
# It also measures whether A's CLOCK_MONOTONIC counts the pause: A samples
# /proc/uptime every 0.1 s, B times the pause on its own clock.
P=dax:///dev/dax0.0
SIZE=1024

role_a() {
  make_dax
  flag a_dax
  wait_flag b_dax
  run "$CXLRT" pool create "$P?size=128M"
  (while :; do read -r up _ </proc/uptime; echo "$up"; sleep 0.1; done >"$out/a.uptime") &
  local sampler=$!
  "$KV_WRITER" write "$P" 60 "$SIZE" >"$out/a.writer.log" 2>&1 &
  local writer=$!
  local deadline=$((SECONDS + 90))
  until (($(grep -c '^OK' "$out/a.writer.log") >= 100)); do
    ((SECONDS < deadline)) || fail "the writer did not commit 100 puts: $(tail -3 "$out/a.writer.log")"
    kill -0 "$writer" 2>/dev/null || fail "the writer ended early: $(tail -3 "$out/a.writer.log")"
    sleep 0.2
  done
  flag a_attached
  wait "$writer"
  local rc=$?
  kill "$sampler"
  grep -v '^OK' "$out/a.writer.log"
  ((rc == 3)) || fail "the writer ended with status $rc, not at a failed call (3)"
  grep -q '^ERR.*fenced' "$out/a.writer.log" || fail "the writer's call failed without saying it was fenced"
  log "after cont, the writer's next call failed saying it was fenced"
  local gap
  gap=$(awk 'NR > 1 && $1 - p > g {g = $1 - p} {p = $1} END {printf "%.2f", g}' "$out/a.uptime")
  log "clock: A's /proc/uptime (CLOCK_MONOTONIC) moved at most ${gap} s between two 0.1 s samples"
  echo "$gap" >"$out/a.uptime_gap"
  flag a_done
  run "$CXLRT" pool check "$P"
  log "PASS"
}

role_b() {
  wait_flag a_dax
  make_dax
  flag b_dax
  wait_flag a_attached
  local slot t0 t1 n_stop n_end
  slot=$(awk '$1 == "ATTACHED" {print $3}' "$out/a.writer.log")
  [[ -n "$slot" ]] || fail "no slot in the writer's log"
  read -r t0 _ </proc/uptime
  monitor a stop
  sleep 0.5  # a line A wrote just before the stop lands
  n_stop=$(grep -c '^OK' "$out/a.writer.log")
  log "A stopped with $n_stop puts committed (writer in slot $slot)"
  run "$CXLRT" pool fence "$P" "$slot"
  local rec
  rec=$("$KV_WRITER" recover "$P" "$slot") || fail "RecoverDeadHosts did not recover slot $slot: $rec"
  log "$rec"
  run "$CXLRT" pool info "$P" | grep -E "hosts|slot $slot "
  run "$CXLRT" pool check "$P"
  read -r t1 _ </proc/uptime
  monitor a cont
  log "clock: A was stopped for $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s on B's clock (stop asked to cont sent)"
  wait_flag a_done 90
  n_end=$(grep -c '^OK' "$out/a.writer.log")
  ((n_end == n_stop)) || fail "$((n_end - n_stop)) put(s) of A returned OK after the cont"
  log "no put of A returned OK after the cont ($n_end committed before the stop)"
  run "$KV_WRITER" verify "$P" "$out/a.writer.log" "$SIZE"
  run "$CXLRT" pool check "$P"
  log "PASS"
}
