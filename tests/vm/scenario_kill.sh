# VM scenario "kill": A's kernel is killed (QEMU monitor `quit`) in the
# middle of a stream of KV puts. B fences every slot A held (`pool fence`
# waits the lease and its margin before judging a host dead), finds the pool
# checks clean, and the entry A committed before the kill reads back
# byte-exact.
P=dax:///dev/dax0.0

role_a() {
  make_dax
  flag a_dax
  wait_flag b_dax
  run "$CXLRT" pool create "$P?size=128M"
  head -c 100000 /dev/urandom >/tmp/a.bin
  cp /tmp/a.bin "$out/a.bin"
  run "$CXLRT" kv put ns1 committed /tmp/a.bin --pool "$P"
  head -c 1000000 /dev/urandom >/tmp/big.bin
  flag a_putting
  for i in $(seq 1 200); do "$CXLRT" kv put ns1 "big$i" /tmp/big.bin --pool "$P"; done
  fail "A was not killed during its puts"
}

role_b() {
  wait_flag a_dax
  make_dax
  flag b_dax
  wait_flag a_putting
  sleep 2
  monitor a quit
  local slots
  slots=$("$CXLRT" pool info "$P" | awk '$1 == "slot" && $3 == "attached" {print $2}')
  log "slots A held at the kill: ${slots:-none}"
  for s in $slots; do run "$CXLRT" pool fence "$P" "$s"; done
  run "$CXLRT" pool check "$P"
  run "$CXLRT" kv get ns1 committed -o /tmp/a.got --pool "$P"
  cmp /tmp/a.got "$out/a.bin" || fail "the entry A committed before the kill differs"
  log "A's committed entry reads back byte-exact after the kill"
  run "$CXLRT" kv ls "$P" | tail -5
  run "$CXLRT" pool check "$P"
  log "PASS"
}
