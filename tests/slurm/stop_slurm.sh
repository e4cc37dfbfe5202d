#!/usr/bin/env bash
# Stops only the daemons that start_slurm.sh started (PIDs recorded in $BASE/run/started.pids),
# newest first, after cancelling this cluster's jobs. Never kills by name.
set -uo pipefail
BASE=${SLURM_TEST_BASE:-/tmp/audiollm-slurm}
PIDS=$BASE/run/started.pids
export SLURM_CONF=$BASE/etc/slurm.conf
[ -s "$PIDS" ] || { echo "nothing recorded in $PIDS"; exit 0; }

# let SLURM end job processes (slurmstepd and tasks are not in the PID list)
if scontrol ping 2>/dev/null | grep -q UP; then
  scancel --partition=debug 2>/dev/null || true
  for _ in $(seq 40); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
fi

tac "$PIDS" | while read -r name pid; do
  [ -n "${pid:-}" ] || continue
  if [ "$(cat /proc/$pid/comm 2>/dev/null)" != "$name" ]; then echo "$name ($pid) not running"; continue; fi
  kill -TERM "$pid"
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; echo "$name ($pid) killed with SIGKILL"
  else echo "$name ($pid) stopped"; fi
done
rm -f "$PIDS"
