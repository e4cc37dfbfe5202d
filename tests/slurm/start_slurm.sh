#!/usr/bin/env bash
# Idempotent single-node SLURM bring-up for the tests (root, no systemd), loopback only.
#   bash tests/slurm/start_slurm.sh      (tests/slurm/conftest.py runs it when no cluster answers)
# SLURM_ACCOUNTING=1 (default) also runs MariaDB + slurmdbd so that `sacct` works
# (submitit polls sacct to notice jobs that died without a result file). SLURM_ACCOUNTING=0: no DB.
# SLURM_TEST_BASE (default /tmp/audiollm-slurm) holds config, state, logs and the PID list.
set -euo pipefail

BASE=${SLURM_TEST_BASE:-/tmp/audiollm-slurm}
ACCT=${SLURM_ACCOUNTING:-1}
NODE=localhost
CONF=$BASE/etc/slurm.conf
PIDS=$BASE/run/started.pids            # "name pid" of every daemon THIS script started
export SLURM_CONF=$CONF
export MYSQL_UNIX_PORT=$BASE/mysql/mysqld.sock

log()   { echo "[start_slurm $(date +%T)] $*"; }
alive() { [ -n "${1:-}" ] && [ "$(cat /proc/$1/comm 2>/dev/null)" = "$2" ]; }   # pid + process name
pidof_file() { cat "$1" 2>/dev/null || true; }
wait_for() { for _ in $(seq 300); do eval "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; log "timed out: $1"; return 1; }
record() { echo "$1 $2" >> "$PIDS"; log "started $1 (pid $2)"; }
. "$(dirname "$0")/accounting.sh"

# 0. packages (skipped when already installed)
PKGS="slurmctld slurmd slurm-client munge"; [ "$ACCT" = 1 ] && PKGS="$PKGS slurmdbd mariadb-server"
MISSING=$(for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"; done)
if [ -n "$MISSING" ]; then
  log "installing:" $MISSING
  ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $MISSING >/dev/null
fi

mkdir -p "$BASE"/{etc,state,spool,log,run,munge} /run/munge /etc/slurm
chown munge:munge "$BASE/munge" /run/munge; chmod 0755 "$BASE/munge" /run/munge
touch "$PIDS"

# 1. munge key (Debian's postinst normally creates it)
KEY=/etc/munge/munge.key
[ -s "$KEY" ] || { mkdir -p /etc/munge; dd if=/dev/urandom of="$KEY" bs=1 count=1024 status=none; }
chown munge:munge /etc/munge "$KEY"; chmod 0700 /etc/munge; chmod 0400 "$KEY"

# 2. config files (rewritten each time; real topology from `slurmd -C`, 90% of RAM)
TOPO=$(slurmd -C | head -n1 | grep -o 'CPUs=.*ThreadsPerCore=[0-9]*')
MEM_MB=$(awk '/MemTotal/ {printf "%d", $2/1024*0.9}' /proc/meminfo)
if [ "$ACCT" = 1 ]; then
  ACCT_CONF="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux"
else
  ACCT_CONF="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
cat > "$CONF" <<EOF
ClusterName=ci
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before restarting (default 120 s)
AuthInfo=cred_expire=10
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/slurmd-%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=2
$ACCT_CONF
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
# SIGTERM to SIGKILL: room for a cancelled job to finish its step and publish its checkpoint
# on a loaded machine (5 s may not be: a cancel in CI left a job without its end state); SLURM's default is 30
KillWait=15
Waittime=0
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=localhost $TOPO RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
cat > "$BASE/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
DebugLevel=info
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
chmod 0600 "$BASE/etc/slurmdbd.conf"
# plain `sbatch` etc. then work without SLURM_CONF (tox/nox strip env vars); never replace a real file
if [ ! -e /etc/slurm/slurm.conf ] || [ -L /etc/slurm/slurm.conf ]; then ln -sfn "$CONF" /etc/slurm/slurm.conf; fi

# 3. munged as user munge; default socket path (slurmdbd connections ignore AuthInfo=socket=)
P=$(pidof_file "$BASE/munge/munged.pid")
if alive "$P" munged; then log "munged already running (pid $P)"; else
  runuser -u munge -- /usr/sbin/munged --socket=/run/munge/munge.socket.2 \
    --pid-file="$BASE/munge/munged.pid" --log-file="$BASE/munge/munged.log" --seed-file="$BASE/munge/munged.seed"
  wait_for '[ -S /run/munge/munge.socket.2 ] && [ -s "$BASE/munge/munged.pid" ]'
  record munged "$(pidof_file "$BASE/munge/munged.pid")"
fi
munge -n | unmunge >/dev/null

if [ "$ACCT" = 1 ]; then
  # 4. MariaDB (accounting.sh)
  start_mariadb
  # 5. slurmdbd (reads slurmdbd.conf next to $SLURM_CONF)
  P=$(pidof_file "$BASE/run/slurmdbd.pid")
  if alive "$P" slurmdbd; then log "slurmdbd already running (pid $P)"; else
    start_slurmdbd /usr/sbin/slurmdbd
    record slurmdbd "$(pidof_file "$BASE/run/slurmdbd.pid")"
  fi
  if [ -z "$(sacctmgr -n -P show cluster ci format=cluster)" ]; then
    sacctmgr -i add cluster ci >/dev/null
    sacctmgr -i add account ci_acct >/dev/null
    sacctmgr -i add user root account=ci_acct >/dev/null
  fi
fi

# 6. slurmctld
P=$(pidof_file "$BASE/run/slurmctld.pid")
if alive "$P" slurmctld; then log "slurmctld already running (pid $P); reconfigure"; scontrol reconfigure || true; else
  rm -f "$BASE/run/slurmctld.pid"
  /usr/sbin/slurmctld -i
  wait_for 'scontrol ping | grep -q UP'
  # Jobs it recovered from the state an earlier run saved (a session stopped mid-test) are
  # no test's: they would queue again among the new jobs. Job ids go on counting (no -c).
  OLD=$(squeue -h -o %i | tr '\n' ' ')
  [ -z "${OLD// }" ] || { log "cancelling jobs of an earlier run: $OLD"; scancel $OLD || true; }
  record slurmctld "$(pidof_file "$BASE/run/slurmctld.pid")"
fi

# 7. slurmd; -N makes the node name independent of `hostname`
P=$(pidof_file "$BASE/run/slurmd-$NODE.pid")
if alive "$P" slurmd; then log "slurmd already running (pid $P)"; else
  rm -f "$BASE/run/slurmd-$NODE.pid"
  /usr/sbin/slurmd -N "$NODE"
  wait_for '[ -s "$BASE/run/slurmd-$NODE.pid" ]'
  record slurmd "$(pidof_file "$BASE/run/slurmd-$NODE.pid")"
fi

# 8. wait until the node is usable (resume it if it registered as down/drained)
ST=
for _ in $(seq 60); do
  ST=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
  case "$ST" in
    idle|mix|alloc) log "node $NODE is $ST"; sinfo; exit 0 ;;
    down*|drain*|fail*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
  esac
  sleep 0.5
done
log "node not ready (state '$ST')"; tail -n 20 "$BASE/log/slurmctld.log" "$BASE/log/slurmd-$NODE.log" >&2
exit 1
