# Sourced by start_slurm.sh and start_cluster.sh (their log, alive, pidof_file, wait_for,
# record, BASE, MYSQL_UNIX_PORT): the accounting's two daemons, started the same way by both.
#
# `start_mariadb`: MariaDB for slurmdbd, a private datadir, unix socket only
# (--skip-networking); kept when it runs already.
start_mariadb() {
  mkdir -p "$BASE/mysql"; chown mysql:mysql "$BASE/mysql"
  if [ ! -d "$BASE/mysql/data/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$BASE/mysql/data" --auth-root-authentication-method=socket >"$BASE/log/mariadb-install.log" 2>&1
  fi
  P=$(pidof_file "$BASE/mysql/mysqld.pid")
  if alive "$P" mariadbd; then log "mariadbd already running (pid $P)"; else
    rm -f "$BASE/mysql/mysqld.pid"
    setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$BASE/mysql/data" \
      --socket="$MYSQL_UNIX_PORT" --pid-file="$BASE/mysql/mysqld.pid" --skip-networking \
      --log-error="$BASE/mysql/mariadb.err" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
      </dev/null >/dev/null 2>&1 &
    wait_for 'mariadb --socket="$MYSQL_UNIX_PORT" -e "select 1"'
    record mariadbd "$(pidof_file "$BASE/mysql/mysqld.pid")"
  fi
}

# `start_slurmdbd COMMAND...` starts slurmdbd with COMMAND and waits until it answers.
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
