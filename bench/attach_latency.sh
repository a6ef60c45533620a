#!/bin/bash
# `ups-doctor attach` latency on a 2-rank torchrun job (gloo, CPU) started outside ups-doctor:
# a stuck one (tests/programs/ddp.py, rank 1 skips step 3's all-reduce) and a healthy one
# (tests/programs/launchers.py), 5 attaches each with the default 3 s window. Prints one line per
# attach: wall seconds, exit status and attach.json's state. The jobs are this script's own
# children (each in a session of its own) and are killed at the end.
# Usage: bench/attach_latency.sh [OUT_DIR]   (UPS_DOCTOR_BIN, UPS_DOCTOR_PYTHON as for the tests)
set -u
cd "$(dirname "$0")/.."
BIN=${UPS_DOCTOR_BIN:-${CARGO_TARGET_DIR:-target}/debug/ups-doctor}
PY=${UPS_DOCTOR_PYTHON:-$HOME/.cache/ups-doctor/pytorch-2.11.0/bin/python}
OUT=${1:-$(mktemp -d)}
export PATH="$(dirname "$PY"):$PATH"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for kind in stuck healthy; do
  if [ $kind = stuck ]; then
    args=(tests/programs/ddp.py --steps 100000 --skip-rank 1 --skip-step 3)
  else
    args=(tests/programs/launchers.py --launcher env --steps 100000)
  fi
  setsid torchrun --nproc_per_node 2 --master_port "$PORT" "${args[@]}" > "$OUT/$kind.log" 2>&1 &
  job=$!
  sleep 25
  echo "$kind: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for i in 1 2 3 4 5; do
    start=$(date +%s.%N)
    "$BIN" attach "$job" --out "$OUT/$kind-$i" > /dev/null 2>&1
    rc=$?
    end=$(date +%s.%N)
    state=$(grep -o '"state": "[a-z]*"' "$OUT/$kind-$i/attach.json")
    echo "$kind $i: $(echo "$end - $start" | bc) s, exit $rc, $state"
  done
  kill -- "-$job"
  wait "$job" 2> /dev/null
done
