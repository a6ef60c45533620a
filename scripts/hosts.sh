#!/usr/bin/env bash
# Hosts of their own on this one machine, for the tests that cross a network (issue 59): a group of
# N hosts, each with its own network namespace (an address on a private bridge and nothing else),
# UTS namespace (its host name), PID namespace, IPC namespace and mount namespace (its own /dev/shm,
# /tmp and /etc/hosts), so that nothing a host does can be seen from another except over the
# network. Optionally a Slurm cluster across them: munged, slurmctld on the first host and one slurmd
# per host (Debian's slurm-wlm), so that `srun -N 2` places tasks on two hosts.
#
#   scripts/hosts.sh start GROUP N [--slurm]   make hosts node1..nodeN (addresses 10.251.0.11..)
#   scripts/hosts.sh exec GROUP HOST -- CMD…   run CMD on HOST (its namespaces, this folder)
#   scripts/hosts.sh stop GROUP                end every process of the group's hosts, remove them
#   scripts/hosts.sh sweep                     stop the groups whose owner is gone
#
# GROUP is a short name (letters, digits; ≤ 8): its network namespaces are `ud-GROUP-hub` (the
# bridge) and `ud-GROUP-nodeI`. Each group is a network of its own: two groups never see each
# other, so every group uses the same addresses. Its files are under $UPS_DOCTOR_HOSTS_DIR
# (/run/ups-doctor-hosts)/GROUP: the hosts file, each host's init pid, the Slurm config, munge key,
# socket, state and logs. What is outside /tmp and /dev/shm (the repository, the cache, a test's
# folder under the target directory) is the hosts' shared file system, as a cluster's is; folders
# under /tmp that must be shared too (a checkout in /tmp) are named, colon-separated, in
# UPS_DOCTOR_HOSTS_SHARE: each host's own /tmp has them at the same path.
#
# Each host's first process (its PID 1, a few lines of Python that reap) holds the namespaces;
# `stop` kills it, and the kernel then kills every process left in that PID namespace: nothing a
# test started on a host outlives the group. `start` records the owner (the environment's
# UPS_DOCTOR_HOSTS_OWNER, else the caller's parent); `sweep` (also run by every `start`) stops the
# groups whose owner no longer runs, so a test killed outright leaves nothing behind for long.
set -euo pipefail

DIR=${UPS_DOCTOR_HOSTS_DIR:-/run/ups-doctor-hosts}
NET=10.251.0
SLURM_PORT=6917

die() { echo "hosts: $*" >&2; exit 1; }

# shellcheck source=scripts/slurm-conf.sh
. "$(dirname "$0")/slurm-conf.sh"

check_group() {
  [[ "$1" =~ ^[a-z0-9]{1,8}$ ]] || die "group '$1': use 1-8 lower-case letters or digits"
}

# The host's init pid, only when that process is alive and is the init this script started.
init_of() { # GROUP HOST
  local pid
  pid=$(cat "$DIR/$1/$2.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && grep -qa "ups-doctor-host-init" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

# PID 1 of a host: names the host, mounts its own /dev/shm, /tmp and /etc/hosts, says it is
# ready, then reaps whatever is orphaned to it until it is killed.
INIT='
import os, signal, socket, subprocess, sys
host, hosts, ready, stage, shared = sys.argv[1:6]
socket.sethostname(host)
def mount(*what):
    subprocess.run(["mount", *what], check=True)
# The shared file system under /tmp (a checkout or target folder there): set aside before the
# host gets a /tmp of its own, then put back at the same path in it.
kept = []
for path in sorted(p for p in shared.split(":") if p == "/tmp" or p.startswith("/tmp/")):
    if os.path.isdir(path) and not any(path == k or path.startswith(k + "/") for _, k in kept):
        spot = os.path.join(stage, str(len(kept)))
        os.makedirs(spot, exist_ok=True)
        mount("--bind", path, spot)
        kept.append((spot, path))
mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/dev/shm")
mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/tmp")
for spot, path in kept:
    os.makedirs(path, exist_ok=True)
    mount("--move", spot, path)
mount("--bind", hosts, "/etc/hosts")
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
open(ready, "w").close()
while True:
    signal.sigwait({signal.SIGCHLD})
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
'

start_host() { # GROUP I
  local g=$1 i=$2 host="node$2" ns="ud-$1-node$2" gdir="$DIR/$1"
  ip netns add "$ns"
  ip -n "ud-$g-hub" link add "h$i" type veth peer name eth0 netns "$ns"
  ip -n "ud-$g-hub" link set "h$i" master br0 up
  ip -n "$ns" addr add "$NET.$((10 + i))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  rm -f "$gdir/$host.ready"
  # nsenter, not `ip netns exec`: that one mounts a /sys of its own, without the cgroup file systems
  # that slurmd and ups-doctor's scenario cgroups need.
  setsid nsenter --net="/run/netns/$ns" unshare --uts --pid --ipc --mount --fork --mount-proc --propagation private \
    /usr/bin/python3 -c "$INIT" "$host" "$gdir/hosts" "$gdir/$host.ready" "$gdir/$host.stage" \
    "${UPS_DOCTOR_HOSTS_SHARE:-}" ups-doctor-host-init \
    </dev/null >>"$gdir/$host.log" 2>&1 &
  local outer=$! child=""
  for _ in $(seq 1 100); do
    [ -e "$gdir/$host.ready" ] && child=$(cat "/proc/$outer/task/$outer/children" 2>/dev/null | awk '{print $1}')
    [ -n "$child" ] && break
    sleep 0.1
  done
  [ -n "$child" ] || { cat "$gdir/$host.log" >&2; die "host $host of group $g did not start"; }
  echo "$child" >"$gdir/$host.pid"
}

on() { # GROUP HOST CMD…: CMD in the host's namespaces, in this folder
  local g=$1 host=$2 pid
  shift 2
  pid=$(init_of "$g" "$host") || die "no host $host in group $g (scripts/hosts.sh start $g N)"
  exec nsenter --target "$pid" --net --uts --pid --ipc --mount --wd="$PWD" -- "$@"
}

write_slurm_conf() { # GROUP N
  local g=$1 n=$2 sdir="$DIR/$1/slurm" i nodes=""
  mkdir -p "$sdir/state" "$sdir/log"
  for i in $(seq 1 "$n"); do mkdir -p "$sdir/spool/node$i"; done
  local cpus mem
  cpus=$(nproc)
  mem=$(free -m | awk '/^Mem:/ { printf "%d", $2 * 0.9 / '"$n"' }')
  {
    echo "# Written by scripts/hosts.sh: a Slurm cluster across the hosts of group $g."
    echo "ClusterName=ups-doctor-$g"
    echo "SlurmctldHost=node1($NET.11)"
    echo "SlurmctldPort=$SLURM_PORT"
    echo "SlurmdPort=$((SLURM_PORT + 1))"
    slurm_conf_common "$sdir" "slurmd-%n"
    for i in $(seq 1 "$n"); do
      echo "NodeName=node$i NodeAddr=$NET.$((10 + i)) CPUs=$cpus RealMemory=$mem State=UNKNOWN"
      nodes="${nodes:+$nodes,}node$i"
    done
    echo "PartitionName=debug Nodes=$nodes Default=YES MaxTime=60 State=UP OverSubscribe=FORCE:8"
  } >"$sdir/slurm.conf"
}

start_slurm() { # GROUP N
  local g=$1 n=$2 sdir="$DIR/$1/slurm" i
  for p in munged slurmctld slurmd sinfo srun; do
    command -v "$p" >/dev/null || die "\`$p\` not found: apt-get install slurm-wlm"
  done
  write_slurm_conf "$g" "$n"
  (umask 077 && dd if=/dev/urandom of="$sdir/munge.key" bs=1024 count=1 status=none)
  # One munged for the group, reached by every host through its socket on the shared file system
  # (a path socket crosses network namespaces). On node1, so that it dies with the group.
  (on "$g" node1 munged --force --key-file="$sdir/munge.key" --socket="$sdir/munge.socket" \
    --pid-file="$sdir/munged.pid" --log-file="$sdir/log/munged.log" --seed-file="$sdir/munge.seed" \
    </dev/null >>"$sdir/log/munged.out" 2>&1)
  (on "$g" node1 slurmctld -i -f "$sdir/slurm.conf" </dev/null >>"$sdir/log/slurmctld.out" 2>&1)
  for i in $(seq 1 "$n"); do
    (on "$g" "node$i" slurmd -f "$sdir/slurm.conf" -N "node$i" </dev/null >>"$sdir/log/slurmd.out" 2>&1)
  done
  local states=""
  for _ in $(seq 1 120); do
    states=$( (on "$g" node1 env SLURM_CONF="$sdir/slurm.conf" timeout 10 sinfo -h -N -o %T) 2>/dev/null | sort | uniq -c | xargs || true)
    if [ "$states" = "$n idle" ]; then
      echo "hosts: Slurm of group $g up: $n nodes idle; SLURM_CONF=$sdir/slurm.conf" >&2
      return
    fi
    sleep 0.5
  done
  tail -n 20 "$sdir"/log/*.log >&2 || true
  die "the Slurm nodes of group $g never all became idle (sinfo: $states)"
}

start() { # GROUP N [--slurm]
  local g=$1 n=$2 slurm=${3:-}
  check_group "$g"
  [[ "$n" =~ ^[1-9]$ ]] || die "hosts '$n': give 1 to 9"
  [ "$(id -u)" = 0 ] || die "needs root (network, UTS, PID and mount namespaces)"
  for p in ip nsenter unshare /usr/bin/python3; do
    command -v "$p" >/dev/null || die "\`$p\` not found (iproute2, util-linux, python3)"
  done
  sweep
  stop "$g"
  local gdir="$DIR/$g" i
  mkdir -p "$gdir"
  echo "${UPS_DOCTOR_HOSTS_OWNER:-$PPID}" >"$gdir/owner"
  {
    echo "127.0.0.1 localhost"
    for i in $(seq 1 "$n"); do echo "$NET.$((10 + i)) node$i"; done
  } >"$gdir/hosts"
  ip netns add "ud-$g-hub"
  ip -n "ud-$g-hub" link add br0 type bridge
  ip -n "ud-$g-hub" link set br0 up
  for i in $(seq 1 "$n"); do start_host "$g" "$i"; done
  echo "$n" >"$gdir/count"
  if [ "$slurm" = --slurm ]; then start_slurm "$g" "$n"; fi
  echo "hosts: group $g: $n hosts (node1..node$n, $NET.11..$NET.$((10 + n)))" >&2
}

stop() { # GROUP
  local g=$1 gdir="$DIR/$1" pid f
  check_group "$g"
  for f in "$gdir"/node*.pid; do
    [ -e "$f" ] || continue
    if pid=$(init_of "$g" "$(basename "$f" .pid)"); then
      # The init is PID 1 of the host: when it dies the kernel kills the rest of its namespace.
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    fi
  done
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^ud-$g-(hub|node[0-9])\$" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$gdir"
}

sweep() {
  local gdir g owner
  for gdir in "$DIR"/*/; do
    [ -d "$gdir" ] || continue
    g=$(basename "$gdir")
    owner=$(cat "$gdir/owner" 2>/dev/null || echo "")
    if [ -z "$owner" ] || [ ! -d "/proc/$owner" ]; then stop "$g"; fi
  done
}

case "${1:-}" in
  start) [ $# -ge 3 ] || die "usage: start GROUP N [--slurm]"; start "$2" "$3" "${4:-}" ;;
  exec)
    [ $# -ge 5 ] && [ "$4" = -- ] || die "usage: exec GROUP HOST -- CMD…"
    g=$2 host=$3; shift 4; on "$g" "$host" "$@" ;;
  stop) [ $# -ge 2 ] || die "usage: stop GROUP"; stop "$2" ;;
  sweep) sweep ;;
  *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
