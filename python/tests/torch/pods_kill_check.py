"""A dead rank across pods (issue 28): pods_check.py's kill case, one
process per rank started here as torchrun starts them (RANK, WORLD_SIZE,
MASTER_ADDR=127.0.0.1; torchrun itself ends every rank when one exits, so
it cannot show what the others see). For each case (pod layout, rank
killed), every other rank must fail its next all-reduce within the bound,
with an error, and exit; no rank may hang (each is killed at the case's
deadline, which fails the case).

Usage: pods_kill_check.py MASTER_PORT"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import cxlrt

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 29571
TIMEOUT_S = 4.0
# Within the groups' timeout: a dead rank is seen by its pod's peers
# through the pool's heartbeats and by its rails' peers as closed
# connections, and a rank whose step failed aborts its pod's communicator
# and its engine groups (docs/python.md, "Across pods"); measured about 2 s.
# 2 s over it for a loaded 2-core machine.
BOUND_S = TIMEOUT_S + 2
CASES = [
    ("0,0,1,1", 3),    # 2 x 2: a rank off rail 0 in the second pod
    ("0,0,1,1", 0),    # the first pod's local rank 0 (rail 0, the store's host is rank 0's)
    ("0,1,1,0,1", 2),  # 2 + 3: a rank of the larger pod
]

failed = []
for case, (layout, victim) in enumerate(CASES):
    n = len(layout.split(","))
    port = PORT + case
    out = tempfile.mkdtemp(prefix="cxlrt-pods-kill-")
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   CXLRT_TORCH_PODS=layout, CXLRT_TORCH_PODS_KILL=str(victim),
                   CXLRT_TORCH_PODS_OUT=out, CXLRT_TORCH_PODS_BOUND_S=str(BOUND_S),
                   CXLRT_TORCH_CHECK_TIMEOUT_S=str(TIMEOUT_S),
                   CXLRT_TORCH_PODS_TAG=f"kill{port}")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "pods_check.py")],
                                      env=env))
    deadline = time.monotonic() + 120 + BOUND_S  # start-up (torch import) + the bound
    codes = []
    for r, p in enumerate(procs):
        try:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            codes.append("hung")
    took = {}
    for r in range(n):
        try:
            with open(os.path.join(out, str(r))) as f:
                took[r] = float(f.read())
        except OSError:
            pass
    # The pools: their makers exit without their atexit (os._exit), the
    # victim before anything.
    for pod in sorted(set(layout.split(","))):
        try:
            cxlrt.Pool.destroy(f"emu://torchpods-kill{port}-{pod}", force=True)
        except cxlrt.Error:
            pass
    shutil.rmtree(out, ignore_errors=True)
    want = {r: (3 if r == victim else 0) for r in range(n)}
    got = dict(enumerate(codes))
    line = (f"pods {layout}, rank {victim} killed: exit codes {got}, errors after "
            f"{ {r: round(t, 2) for r, t in sorted(took.items())} } s (bound {BOUND_S} s)")
    print(line, flush=True)
    if got != want or set(took) != set(range(n)) - {victim}:
        failed.append(line)

if failed:
    print("FAILED:\n  " + "\n  ".join(failed))
    sys.exit(1)
print(f"every rank failed within {BOUND_S} s in {len(CASES)} cases")
