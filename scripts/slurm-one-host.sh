#!/usr/bin/env bash
# A one-host Slurm cluster for ups-doctor's srun tests: munged, slurmctld and slurmd from Debian's
# slurm-wlm, as root, without systemd, with every file under one private folder so that a real
# Slurm set-up on the machine (/etc/slurm, /run/munge) is neither read nor touched.
#
#   scripts/slurm-one-host.sh start    write the config, start the daemons, wait until the node is idle
#   scripts/slurm-one-host.sh stop     cancel our jobs, end the daemons this script started
#   scripts/slurm-one-host.sh status   exit 0 when the node answers idle/mixed/allocated
#   scripts/slurm-one-host.sh env      print the SLURM_CONF export for running srun by hand
#
# The folder is $UPS_DOCTOR_SLURM_DIR (default /tmp/ups-doctor-slurm): slurm.conf, the munge key
# and socket, state, spool, logs and pid files. `start` is idempotent: a running cluster whose
# node answers is left as it is; daemons of an earlier start that no longer answer are ended
# (by the pids in their pid files) and started again. Ports: $UPS_DOCTOR_SLURM_PORT (6917) for
# slurmctld and the next one for slurmd, on 127.0.0.1.
#
# Choices: ProctrackType=proctrack/linuxproc and TaskPlugin=task/none, so that Slurm makes no
# cgroup of its own (ups-doctor puts every scenario in its own cgroup); the partition shares
# cores (OverSubscribe=FORCE), so tests that each start 2 tasks run at once on a 2-core machine
# instead of queueing behind each other.
set -euo pipefail

DIR=${UPS_DOCTOR_SLURM_DIR:-/tmp/ups-doctor-slurm}
PORT=${UPS_DOCTOR_SLURM_PORT:-6917}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

die() { echo "slurm-one-host: $*" >&2; exit 1; }

# shellcheck source=scripts/slurm-conf.sh
. "$(dirname "$0")/slurm-conf.sh"

# A pid from a pid file, only when that process is alive and is the program we started.
running() { # NAME PIDFILE
  local pid
  pid=$(cat "$2" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$1" ] && echo "$pid"
}

node_state() {
  timeout 10 sinfo -h -N -o %T 2>/dev/null | head -1
}

status() {
  [ -f "$CONF" ] || return 1
  # sinfo retries for seconds when slurmctld is gone: ask it only when our daemons run.
  running slurmctld "$DIR/slurmctld.pid" >/dev/null && running slurmd "$DIR/slurmd.pid" >/dev/null \
    || return 1
  # A trailing * (idle*) means the node does not answer.
  case "$(node_state)" in
    idle | mixed | allocated) return 0 ;;
    *) return 1 ;;
  esac
}

write_conf() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  # RealMemory a bit under the total, so slurmd's own reading is never below it.
  mem=$(free -m | awk '/^Mem:/ { printf "%d", $2 * 0.9 }')
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  cat >"$CONF" <<EOF
# Written by scripts/slurm-one-host.sh: a one-host cluster for ups-doctor's tests.
ClusterName=ups-doctor-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
$(slurm_conf_common "$DIR" slurmd)
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=60 State=UP OverSubscribe=FORCE:8
EOF
}

start_munged() {
  if running munged "$DIR/munged.pid" >/dev/null; then return; fi
  # A key of our own (munged insists it is readable by its user only).
  if [ ! -s "$DIR/munge.key" ]; then
    (umask 077 && dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 status=none)
  fi
  # --force: munged refuses to run as root, or next to a stale socket, without it.
  munged --force --key-file="$DIR/munge.key" --socket="$DIR/munge.socket" \
    --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge.seed" \
    </dev/null >>"$DIR/log/munged.out" 2>&1
}

start() {
  [ "$(id -u)" = 0 ] || die "needs root (the daemons run as root here)"
  for p in munged slurmctld slurmd sinfo srun; do
    command -v "$p" >/dev/null || die "\`$p\` not found: apt-get install slurm-wlm"
  done
  if status; then echo "slurm-one-host: already up ($(node_state)); SLURM_CONF=$CONF"; return; fi
  stop_daemons
  mkdir -p "$DIR"
  write_conf
  start_munged
  # -i: ignore saved state (a fresh queue every start); slurmd -N names the node whatever the
  # host name resolves to.
  slurmctld -i -f "$CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1
  slurmd -f "$CONF" -N "$(hostname -s)" </dev/null >>"$DIR/log/slurmd.out" 2>&1
  local i
  for i in $(seq 1 60); do
    if status; then
      echo "slurm-one-host: up ($(node_state)) after ${i}x0.5 s; SLURM_CONF=$CONF"
      return
    fi
    sleep 0.5
  done
  echo "slurm-one-host: the node never became idle; sinfo says: $(node_state)" >&2
  tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
  stop_daemons
  exit 1
}

stop_daemons() {
  local name pid
  for name in slurmd slurmctld munged; do
    if pid=$(running "$name" "$DIR/$name.pid"); then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
      [ ! -d "/proc/$pid" ] || kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

stop() {
  [ -f "$CONF" ] || return 0
  if status; then timeout 10 scancel --full --quiet -u root 2>/dev/null || true; fi
  stop_daemons
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
