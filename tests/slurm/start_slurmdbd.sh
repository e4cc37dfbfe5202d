# Sourced by start_slurm.sh and start_cluster.sh (their log, alive, pidof_file, wait_for,
# BASE): `start_slurmdbd COMMAND...` starts slurmdbd with COMMAND and waits until it answers.
# slurmdbd has ended at its start once, its first query given no result by a MariaDB that
# had started the same second on a kept data directory (the next start served): three tries.
start_slurmdbd() {
  for try in 1 2 3; do
    rm -f "$BASE/run/slurmdbd.pid"
    "$@"
    wait_for 'sacctmgr -n show cluster' && return 0
    tail -n 20 "$BASE/log/slurmdbd.log" >&2
    P=$(pidof_file "$BASE/run/slurmdbd.pid"); if alive "$P" slurmdbd; then kill "$P"; fi
    [ "$try" = 3 ] && exit 1
    log "slurmdbd did not answer (start $try of 3): again"; sleep 2
  done
}
