"""A hostile rank: writes `worker` markers that name processes which are not its own.

argv: FOREIGN_PID HANDSHAKE_DIR
- a worker marker naming FOREIGN_PID (an unrelated process the test started);
- a real child that reports itself as a worker and exits; its pid is written to
  HANDSHAKE_DIR/recycled_pid, and the rank waits for HANDSHAKE_DIR/go, by which time the test
  has put an unrelated process on that very pid (a recycled pid).
Only the plain standard library: the marker wire format of src/protocol.rs, by hand.
"""
import json
import os
import subprocess
import sys
import time

fd = int(os.environ["UPS_DOCTOR_MARKER_FD"])


def emit(marker):
    os.write(fd, (json.dumps(marker) + "\n").encode())


foreign, handshake = int(sys.argv[1]), sys.argv[2]
emit({"t": "start", "pid": os.getpid(), "rank": 0, "world_size": 1})
emit({"t": "worker", "id": 0, "pid": foreign, "start_method": "fork"})
child = subprocess.Popen([sys.executable, "-c", "pass"])
emit({"t": "worker", "id": 1, "pid": child.pid, "start_method": "fork"})
child.wait()
with open(os.path.join(handshake, "recycled_pid.tmp"), "w") as f:
    f.write(str(child.pid))
os.rename(os.path.join(handshake, "recycled_pid.tmp"), os.path.join(handshake, "recycled_pid"))
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(handshake, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
emit({"t": "done"})
