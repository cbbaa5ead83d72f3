# VM scenario "basic": two kernels, one CXL memdev. A makes the pool on
# /dev/dax0.0, B attaches; both see two machines; KV entries put on one
# kernel read back byte-exact on the other. Then one process in each kernel
# (vm_kv_writer cross-a / cross-b): A allocates 200 blocks of 4 KiB, B checks
# their bytes and frees them (remote frees, through A's ring), A's bytes in
# use come back to what they were; A puts an entry, B pins it (Lookup), A's
# Delete is refused while pinned, A's allocations of its size leave it
# byte-exact for B, B releases, A's Delete succeeds and B no longer finds it.
# Pool check clean from both.
P=dax:///dev/dax0.0

role_a() {
  make_dax
  flag a_dax
  wait_flag b_dax
  run "$CXLRT" doctor | grep -E "^(cxl|dax|pool) "
  run "$CXLRT" pool create "$P?size=128M"
  head -c 100000 /dev/urandom >/tmp/a.bin
  run "$CXLRT" kv put ns1 from-a /tmp/a.bin --pool "$P"
  cp /tmp/a.bin "$out/a.bin"
  "$CXLRT" pool attach "$P" --seconds 20 >/tmp/attach.log 2>&1 &
  flag a_ready
  wait_flag b_put
  run "$CXLRT" kv get ns1 from-b -o /tmp/b.got --pool "$P"
  cmp /tmp/b.got "$out/b.bin" || fail "entry from-b differs from what B put"
  log "from-b read back byte-exact"
  run "$CXLRT" pool info "$P" | tee /tmp/info.txt
  grep -q "on vm-a" /tmp/info.txt && grep -q "on vm-b" /tmp/info.txt ||
    fail "pool info does not show both machines (vm-a and vm-b)"
  flag a_checked
  run "$KV_WRITER" cross-a "$P" "$out"
  wait_flag b_done
  run "$CXLRT" pool check "$P"
  wait
  log "PASS"
}

role_b() {
  wait_flag a_dax
  make_dax
  flag b_dax
  wait_flag a_ready
  run "$CXLRT" doctor | grep -E "^(cxl|dax|pool) "
  "$CXLRT" pool attach "$P" --seconds 20 >/tmp/attach.log 2>&1 &
  run "$CXLRT" kv get ns1 from-a -o /tmp/a.got --pool "$P"
  cmp /tmp/a.got "$out/a.bin" || fail "entry from-a differs from what A put"
  log "from-a read back byte-exact"
  head -c 77777 /dev/urandom >/tmp/b.bin
  cp /tmp/b.bin "$out/b.bin"
  run "$CXLRT" kv put ns1 from-b /tmp/b.bin --pool "$P"
  flag b_put
  wait_flag a_checked
  run "$KV_WRITER" cross-b "$P" "$out"
  run "$CXLRT" pool info "$P" | tee /tmp/info.txt
  run "$CXLRT" pool check "$P"
  flag b_done
  wait
  log "PASS"
}
