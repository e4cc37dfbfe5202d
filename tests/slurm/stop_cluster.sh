#!/usr/bin/env bash
# Stops the multi-node cluster of start_cluster.sh: cancels its jobs, stops only the daemons
# it recorded ($BASE/run/started.pids, newest first, checked by name and $BASE), ends what is
# left inside its node namespaces (job processes, by PID), then deletes the namespaces aunodeI,
# their veths, the bridge aubr0 and /etc/netns/aunodeI. Never kills by name. Keeps logs, state
# and the database under $BASE (rm -rf it for a fresh cluster: job ids restart at 1).
set -uo pipefail
BASE=${SLURM_MULTI_BASE:-/tmp/audiollm-slurm-multi}
BR=aubr0
PIDS=$BASE/run/started.pids
export SLURM_CONF=$BASE/etc/slurm.conf

log() { echo "[stop_cluster $(date +%T)] $*"; }
stop_pid() {   # name pid: TERM, wait up to 15 s, then KILL; only if /proc/pid/comm is still name
  local name=$1 pid=$2   # and $BASE/ is in its command line or environment (not a recycled pid)
  if [ "$(cat /proc/$pid/comm 2>/dev/null)" != "$name" ] ||
     ! cat "/proc/$pid/cmdline" "/proc/$pid/environ" 2>/dev/null | tr '\0' '\n' | grep -qF "$BASE/"; then
    log "$name ($pid) not running (or not ours)"; return
  fi
  kill -TERM "$pid"
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; log "$name ($pid) killed with SIGKILL"
  else log "$name ($pid) stopped"; fi
}

# 1. let SLURM end the jobs (slurmstepd and tasks are not in the PID list). Clients only while
#    the bridge exists: without it, packets for 10.213.7.1 would take the default route.
if [ -f "$SLURM_CONF" ] && ip -4 addr show dev "$BR" 2>/dev/null | grep -q ' 10\.213\.7\.1/' &&
   timeout 10 scontrol ping 2>/dev/null | grep -q UP; then
  JOBS=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${JOBS// }" ]; then
    log "cancelling jobs: $JOBS"
    scancel $JOBS 2>/dev/null || true
    for _ in $(seq 60); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
  fi
fi

# 2. the recorded daemons, newest first (slurmd..., slurmctld, slurmdbd, mariadbd, munged)
if [ -s "$PIDS" ]; then
  tac "$PIDS" | while read -r name pid _; do [ -n "${pid:-}" ] && stop_pid "$name" "$pid"; done
  rm -f "$PIDS"
else
  log "no daemons recorded in $PIDS"
fi

# clients still pointed at this SLURM_CONF now fail locally instead of sending to 10.213.7.1
[ -f "$SLURM_CONF" ] && mv -f "$SLURM_CONF" "$SLURM_CONF.stopped"

# 3. namespaces (names owned by start_cluster.sh): end leftovers (descendants of our slurmd), delete
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^aunode[0-9]+$'); do
  LEFT=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
  if [ -n "${LEFT// }" ]; then
    log "ending leftover processes in $ns: $LEFT"
    kill -TERM $LEFT 2>/dev/null
    for _ in $(seq 50); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.1; done
    LEFT=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [ -n "${LEFT// }" ] && { log "SIGKILL to $LEFT"; kill -KILL $LEFT 2>/dev/null; }
  fi
  ip netns del "$ns" && log "deleted namespace $ns"
done
rm -rf /etc/netns/aunode[0-9]*
for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^auveth[0-9]+$'); do
  ip link del "$dev" 2>/dev/null && log "deleted $dev"
done
if ip link show "$BR" >/dev/null 2>&1; then ip link del "$BR" && log "deleted bridge $BR"; fi
# /etc/netns itself only if start_cluster.sh created it and it is empty now
[ -e "$BASE/run/created-etc-netns" ] && rmdir /etc/netns 2>/dev/null && rm -f "$BASE/run/created-etc-netns"
exit 0
