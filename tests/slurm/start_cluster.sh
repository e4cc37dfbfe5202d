#!/usr/bin/env bash
# Idempotent MULTI-node SLURM on ONE machine for the tests (root, no systemd); tests/slurm/conftest.py
# (fixture slurm_nodes) runs it, and stop_cluster.sh at the end of the session.
# Each node is a network namespace (aunodeI) with its own UTS namespace/hostname, joined by a
# veth pair to a private bridge (aubr0, 10.213.7.1/24); node I has 10.213.7.(10+I).
# slurmctld, slurmdbd, MariaDB and a private munged run in the host network namespace;
# slurmctld and slurmdbd listen on the bridge address only. Coexists with start_slurm.sh (own base dir, ports
# 7817-7819, own munged socket, own MariaDB); never touches /etc/slurm/slurm.conf or /etc/hosts.
# Usage: start_cluster.sh [NODES]      (default 2; NODES 1..50)
#   SLURM_MULTI_BASE   base directory (default /tmp/audiollm-slurm-multi)
# Clients select this cluster with SLURM_CONF=$SLURM_MULTI_BASE/etc/slurm.conf (printed at the end).
set -euo pipefail

NODES=${1:-2}
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 50 ] || { echo "usage: $0 [NODES (1-50)]" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${SLURM_MULTI_BASE:-/tmp/audiollm-slurm-multi}
BR=aubr0; NET=10.213.7; CTL_IP=$NET.1           # private range created here; nothing else is used
CTLD_PORT=7817; SLURMD_PORT=7818; DBD_PORT=7819
CLUSTER=aumulti
CTL_NAME=auctl                                   # hostname of slurmctld/slurmdbd (see in_ctl_ns)
HOST_NAME=$(hostname -s)
CONF=$BASE/etc/slurm.conf
PIDS=$BASE/run/started.pids                      # "name pid [node]" of every daemon THIS script started
MUNGE_SOCK=$BASE/munge/munge.socket
export SLURM_CONF=$CONF
export MYSQL_UNIX_PORT=$BASE/mysql/mysqld.sock

log()   { echo "[start_cluster $(date +%T)] $*"; }
# pid + process name; ours only if $BASE/ is in its command line or environment (SLURM_CONF):
# a recycled pid of start_slurm.sh's daemons (same names) is never taken for ours
alive() { [ -n "${1:-}" ] && [ "$(cat /proc/$1/comm 2>/dev/null)" = "$2" ] &&
          cat "/proc/$1/cmdline" "/proc/$1/environ" 2>/dev/null | tr '\0' '\n' | grep -qF "$BASE/"; }
pidof_file() { cat "$1" 2>/dev/null || true; }
wait_for() { for _ in $(seq 300); do eval "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; log "timed out: $1"; return 1; }
record() { echo "$1 $2 ${3:-}" >> "$PIDS"; log "started $1${3:+ $3} (pid $2)"; }
. "$(dirname "$0")/accounting.sh"
node() { echo "aunode$1"; }
node_ip() { echo "$NET.$((10 + $1))"; }
# Node I: network namespace aunodeI plus its own mount + UTS namespaces, with hostname aunodeI and
# /etc/netns/aunodeI/{hosts,resolv.conf} bound over /etc (what `ip netns exec` does), but keeping
# the host's /sys: `ip netns exec` remounts /sys without /sys/fs/cgroup, and slurmd 22.05 then
# fails ("Unable to initialize cgroup plugin") even with proctrack/linuxproc + task/none.
in_node_ns() {
  local ns=$1; shift
  unshare --mount --uts --propagation slave -- nsenter --net="/run/netns/$ns" -- sh -c \
    'for f in hosts resolv.conf; do mount --bind "/etc/netns/$1/$f" "/etc/$f" || exit 1; done; hostname "$1" && shift && exec "$@"' \
    sh "$ns" "$@"
}
# Host network namespace, but hostname auctl and $BASE/etc/hosts (auctl = bridge address) as
# /etc/hosts: with NoCtldInAddrAny/NoInAddrAny, slurmctld/slurmdbd bind to what their hostname
# resolves to, and the host's own name resolves to 127.0.0.1, which the nodes cannot reach.
in_ctl_ns() {
  unshare --mount --uts --propagation slave -- sh -c \
    'mount --bind "$1/hosts" /etc/hosts && mount --bind "$1/resolv.conf" /etc/resolv.conf && hostname "$2" && shift 2 && exec "$@"' \
    sh "$BASE/etc" "$CTL_NAME" "$@"
}

# 0. packages (skipped when already installed)
PKGS="slurmctld slurmd slurm-client munge slurmdbd mariadb-server iproute2 util-linux"
MISSING=$(for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || echo "$p"; done)
if [ -n "$MISSING" ]; then
  log "installing:" $MISSING
  ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $MISSING >/dev/null
fi

# a running cluster with another node count is stopped first (node lists need a full restart)
if [ -s "$PIDS" ] && [ "$(cat "$BASE/run/nodes" 2>/dev/null)" != "$NODES" ]; then
  log "running cluster has $(cat "$BASE/run/nodes" 2>/dev/null || echo '?') nodes, $NODES requested: restarting it"
  SLURM_MULTI_BASE=$BASE "$HERE/stop_cluster.sh"
fi

mkdir -p "$BASE"/{etc,state,spool,log,run,munge,mysql}
chmod 0755 "$BASE"
touch "$PIDS"
echo "$NODES" > "$BASE/run/nodes"

# 1. network: bridge + one namespace per node (veth auvethI <-> eth0 inside), IPv6 off everywhere.
# First a blackhole for the whole range (a higher metric than the bridge's own route): while the
# bridge is down, or after stop_cluster.sh, a client with a stale SLURM_CONF fails here instead of
# sending anything towards the default route. It is left in place on stop.
ip route replace blackhole "$NET.0/24" metric 4000
if ! ip link show "$BR" >/dev/null 2>&1; then
  ip link add "$BR" type bridge
  log "created bridge $BR"
fi
sysctl -qw "net.ipv6.conf.$BR.disable_ipv6=1" 2>/dev/null || true
ip addr replace "$CTL_IP/24" dev "$BR"
ip link set "$BR" up
HOSTS="127.0.0.1 localhost
$CTL_IP $CTL_NAME$([ "$HOST_NAME" != localhost ] && echo " $HOST_NAME")"
for i in $(seq "$NODES"); do HOSTS="$HOSTS
$(node_ip "$i") $(node "$i")"; done
for i in $(seq "$NODES"); do
  ns=$(node "$i"); veth=auveth$i
  [ -e "/run/netns/$ns" ] || { ip netns add "$ns"; log "created namespace $ns"; }
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 2>/dev/null || true
  if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    ip link del "$veth" 2>/dev/null || true
    ip link add "$veth" type veth peer name eth0 netns "$ns"
  fi
  sysctl -qw "net.ipv6.conf.$veth.disable_ipv6=1" 2>/dev/null || true
  ip link set "$veth" master "$BR" up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$ns" addr replace "$(node_ip "$i")/24" dev eth0
  # No default route in a node: every address but the cluster's own fails locally.
  ip -n "$ns" route del default 2>/dev/null || true
  # bound over /etc/hosts and /etc/resolv.conf by in_node_ns (and by `ip netns exec`); written in
  # place, so running nodes see updates. No nameserver line = only the namespace's own loopback.
  [ -d /etc/netns ] || { mkdir -p /etc/netns; touch "$BASE/run/created-etc-netns"; }
  mkdir -p "/etc/netns/$ns"
  echo "$HOSTS" > "/etc/netns/$ns/hosts"
  echo "# no DNS inside the test cluster (see start_cluster.sh)" > "/etc/netns/$ns/resolv.conf"
done
echo "$HOSTS" > "$BASE/etc/hosts"     # for in_ctl_ns
echo "# no DNS for the test cluster's controller (see start_cluster.sh)" > "$BASE/etc/resolv.conf"

# 2. munge: key shared with the host (Debian's postinst creates it); a private munged + socket
KEY=/etc/munge/munge.key
[ -s "$KEY" ] || { mkdir -p /etc/munge; dd if=/dev/urandom of="$KEY" bs=1 count=1024 status=none; }
chown munge:munge /etc/munge "$KEY"; chmod 0700 /etc/munge; chmod 0400 "$KEY"
chown munge:munge "$BASE/munge"; chmod 0755 "$BASE/munge"
P=$(pidof_file "$BASE/munge/munged.pid")
if alive "$P" munged; then log "munged already running (pid $P)"; else
  rm -f "$BASE/munge/munged.pid"
  runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCK" \
    --pid-file="$BASE/munge/munged.pid" --log-file="$BASE/munge/munged.log" --seed-file="$BASE/munge/munged.seed"
  wait_for '[ -S "$MUNGE_SOCK" ] && [ -s "$BASE/munge/munged.pid" ]'
  record munged "$(pidof_file "$BASE/munge/munged.pid")"
fi
munge -S "$MUNGE_SOCK" -n | unmunge -S "$MUNGE_SOCK" >/dev/null

# 3. config files (rewritten each time). Every node gets the real topology (`slurmd -C`) and
#    a 1/NODES share of 90% of RAM. Fake GPUs: gres gpu:2 per node. A Count-only gpu line does
#    not work in 22.05 (slurmd: "Removing file-less GPU gpu:(null) from final GRES list", node
#    INVAL "gres/gpu count reported lower than configured (0 < 2)"), so gres.conf points at two
#    character device nodes under $BASE/dev (nvidia's major 195; no driver, nothing opens them).
mkdir -p "$BASE/dev"
for g in 0 1; do [ -c "$BASE/dev/nvidia$g" ] || mknod -m 0666 "$BASE/dev/nvidia$g" c 195 "$g"; done
TOPO=$(slurmd -C | head -n1 | grep -o 'CPUs=.*ThreadsPerCore=[0-9]*')
NCPU=$(echo "$TOPO" | sed 's/CPUs=\([0-9]*\).*/\1/')
MEM_MB=$(awk -v n="$NODES" '/MemTotal/ {printf "%d", $2/1024*0.9/n}' /proc/meminfo)
NODELIST=aunode[1-$NODES]; [ "$NODES" = 1 ] && NODELIST=aunode1
{
cat <<EOF
# generated by start_cluster.sh
ClusterName=$CLUSTER
SlurmctldHost=$CTL_NAME($CTL_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# private munged socket; cred_expire also sets how long a requeued job waits before restarting
AuthInfo=socket=$MUNGE_SOCK,cred_expire=10
# slurmctld binds to $CTL_IP only. No NoInAddrAny: srun on the host must listen where the nodes
# can reach it (the host name resolves to 127.0.0.1); slurmd's "any" is its namespace (lo + veth).
CommunicationParameters=NoCtldInAddrAny
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
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
DefMemPerCPU=$((MEM_MB / NCPU))
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=2,sched_interval=2
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$CTL_IP
AccountingStoragePort=$DBD_PORT
# munge socket for connections to slurmdbd (they do NOT use AuthInfo's socket; without this they
# need a munged on the default /run/munge/munge.socket.2)
AccountingStoragePass=$MUNGE_SOCK
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
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
EOF
for i in $(seq "$NODES"); do
  echo "NodeName=$(node "$i") NodeAddr=$(node_ip "$i") NodeHostname=$(node "$i") $TOPO RealMemory=$MEM_MB Gres=gpu:2 State=UNKNOWN"
done
echo "PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} > "$CONF"
cat > "$BASE/etc/gres.conf" <<EOF
# fake GPUs (see start_cluster.sh): jobs get CUDA_VISIBLE_DEVICES=0,1 but no usable device
AutoDetect=off
NodeName=$NODELIST Name=gpu Count=2 File=$BASE/dev/nvidia[0-1]
EOF
cat > "$BASE/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
# with hostname $CTL_NAME (in_ctl_ns): listen on $CTL_IP only
CommunicationParameters=NoInAddrAny
DbdHost=$CTL_NAME
DbdAddr=$CTL_IP
DbdPort=$DBD_PORT
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

# 4. MariaDB (accounting.sh)
start_mariadb

# 5. slurmdbd (reads slurmdbd.conf next to $SLURM_CONF)
P=$(pidof_file "$BASE/run/slurmdbd.pid")
if alive "$P" slurmdbd; then log "slurmdbd already running (pid $P)"; else
  start_slurmdbd in_ctl_ns /usr/sbin/slurmdbd
  record slurmdbd "$(pidof_file "$BASE/run/slurmdbd.pid")"
fi
if [ -z "$(sacctmgr -n -P show cluster "$CLUSTER" format=cluster)" ]; then
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
  sacctmgr -i add account ci_acct >/dev/null
  sacctmgr -i add user root account=ci_acct >/dev/null
fi

# 6. slurmctld (host network namespace, bound to the bridge address)
P=$(pidof_file "$BASE/run/slurmctld.pid")
if alive "$P" slurmctld; then log "slurmctld already running (pid $P); reconfigure"; scontrol reconfigure || true; else
  rm -f "$BASE/run/slurmctld.pid"
  in_ctl_ns /usr/sbin/slurmctld -i
  wait_for 'scontrol ping | grep -q UP' || { tail -n 20 "$BASE/log/slurmctld.log" >&2; exit 1; }
  # Jobs it recovered from the state an earlier run saved (a session stopped mid-test) are
  # no test's: they would queue again among the new jobs. Job ids go on counting (no -c).
  OLD=$(squeue -h -o %i | tr '\n' ' ')
  [ -z "${OLD// }" ] || { log "cancelling jobs of an earlier run: $OLD"; scancel $OLD || true; }
  record slurmctld "$(pidof_file "$BASE/run/slurmctld.pid")"
fi

# 7. one slurmd per node, inside its network namespace with its own hostname
for i in $(seq "$NODES"); do
  ns=$(node "$i"); pf=$BASE/run/slurmd-$ns.pid
  P=$(pidof_file "$pf")
  if alive "$P" slurmd; then log "slurmd $ns already running (pid $P)"; continue; fi
  rm -f "$pf"; mkdir -p "$BASE/spool/slurmd-$ns"
  in_node_ns "$ns" /usr/sbin/slurmd -N "$ns"
  wait_for '[ -s "$pf" ]' || { tail -n 20 "$BASE/log/slurmd-$ns.log" >&2; exit 1; }
  record slurmd "$(pidof_file "$pf")" "$ns"
done

# 8. wait until every node is usable (resume those that registered as down/drained)
for _ in $(seq 120); do
  NOT_READY=0
  while read -r n st; do
    case "$st" in
      idle|mix|alloc|comp*) ;;
      down*|drain*|fail*) NOT_READY=1; scontrol update nodename="$n" state=resume 2>/dev/null || true ;;
      *) NOT_READY=1 ;;
    esac
  done < <(sinfo -h -N -o '%N %t' 2>/dev/null || echo "? unknown")
  if [ "$NOT_READY" = 0 ]; then
    log "cluster '$CLUSTER' ready with $NODES node(s). Clients need:"
    echo "export SLURM_CONF=$CONF"
    sinfo
    exit 0
  fi
  sleep 0.5
done
log "nodes not ready:"; sinfo -N >&2 || true
tail -n 20 "$BASE/log/slurmctld.log" "$BASE"/log/slurmd-aunode*.log >&2
exit 1
