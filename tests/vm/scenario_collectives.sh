# VM scenario "collectives": one rank per kernel (CXLRT_RANK / CXLRT_WORLD_SIZE
# set per guest, as `cxlrt run` would), rendezvous through the pool on
# /dev/dax0.0: all-reduce, all-gather and send/recv with results checked
# (-c 1; the bench fails on a wrong result), then pool check clean.
P=dax:///dev/dax0.0
export CXLRT_WORLD_SIZE=2 CXLRT_POOL=$P

colls() {
  for c in allreduce allgather sendrecv; do
    log "\$ cxlrt bench $c (rank $CXLRT_RANK)"
    "$CXLRT" bench "$c" -b 8 -e 64K -f 8 -n 3 -w 1 -c 1 >"/tmp/$c.txt" 2>&1
    local rc=$?
    cat "/tmp/$c.txt"
    ((rc == 0)) || fail "bench $c exited $rc"
    # Rank 0 prints the table; the others print nothing on success.
    if ((CXLRT_RANK == 0)); then
      grep -q "^# wrong elements: 0$" "/tmp/$c.txt" || fail "$c: wrong results (or no count)"
    fi
  done
}

role_a() {
  make_dax
  flag a_dax
  wait_flag b_dax
  run "$CXLRT" pool create "$P?size=128M"
  flag a_pool
  CXLRT_RANK=0 CXLRT_HOST_ID=0 colls
  flag a_colls
  wait_flag b_colls
  run "$CXLRT" pool check "$P"
  log "PASS"
}

role_b() {
  wait_flag a_dax
  make_dax
  flag b_dax
  wait_flag a_pool
  CXLRT_RANK=1 CXLRT_HOST_ID=1 colls
  flag b_colls
  wait_flag a_colls
  run "$CXLRT" pool check "$P"
  log "PASS"
}
