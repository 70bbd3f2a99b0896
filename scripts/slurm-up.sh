#!/usr/bin/env bash
# Bring up a single-node SLURM cluster on 127.0.0.1 (slurmctld + slurmd + slurmdbd with a
# private MariaDB, munge for auth) from Debian packages. Run as root. Idempotent: daemons that
# are already running (by the PID files this script keeps) are left alone.
#
#   scripts/slurm-up.sh            # install if needed, configure, start, wait for an idle node
#   scripts/slurm-down.sh          # stop exactly the daemons this script started
#
# State lives in $TWOCLOCKS_SLURM_DIR (default /var/tmp/twoclocks-slurm); the config is written
# to /etc/slurm so that sbatch/sacct/squeue find it without SLURM_CONF.
set -euo pipefail

DIR=${TWOCLOCKS_SLURM_DIR:-/var/tmp/twoclocks-slurm}
DB_PORT=${TWOCLOCKS_SLURM_DB_PORT:-3307}
DB_PASS=twoclocks-slurmdbd
NODE=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
PKGS=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

log() { echo "slurm-up: $*" >&2; }
die() { echo "slurm-up: error: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts daemons)"

alive() {  # alive NAME: the daemon we started (pid file) is still running
  local f="$DIR/pids/$1.pid"
  [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local t=$1 what=$2; shift 2
  for _ in $(seq 1 $((t * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "timed out after ${t}s waiting for $what (logs in $DIR/log)"
}

install_packages() {
  local missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_configs() {
  mkdir -p "$DIR"/{pids,log,state,spool,mysql,mysqlrun,munge}
  chown munge:munge "$DIR/munge"
  cat >/etc/slurm/slurm.conf <<EOF
# written by twoclocks scripts/slurm-up.sh: a single-node test cluster on 127.0.0.1
ClusterName=twoclocks
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobCompType=jobcomp/none
MinJobAge=300
KillWait=5
InactiveLimit=0
Waittime=0
MaxArraySize=10001
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  cat >/etc/slurm/slurmdbd.conf <<EOF
# written by twoclocks scripts/slurm-up.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
}

start_munge() {
  alive munged && return 0
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- munged --num-threads=10 \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
    --seed-file="$DIR/munge/munged.seed"
  wait_for 10 munged test -s "$DIR/munge/munged.pid"
  cp "$DIR/munge/munged.pid" "$DIR/pids/munged.pid"
}

start_mariadb() {
  alive mariadbd && return 0
  chown -R mysql:mysql "$DIR/mysql" "$DIR/mysqlrun"
  if [ ! -d "$DIR/mysql/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$DIR/mysql" --auth-root-authentication-method=socket \
      >"$DIR/log/mariadb-install.log" 2>&1
  fi
  mariadbd --no-defaults --user=mysql --datadir="$DIR/mysql" --socket="$DIR/mysqlrun/mysql.sock" \
    --bind-address=127.0.0.1 --port="$DB_PORT" --pid-file="$DIR/mysqlrun/mysql.pid" \
    --log-error="$DIR/mysqlrun/mariadb.log" --innodb-buffer-pool-size=64M \
    --innodb-flush-log-at-trx-commit=2 --skip-name-resolve >/dev/null 2>&1 &
  echo $! >"$DIR/pids/mariadbd.pid"
  wait_for 60 mariadb mariadb --socket="$DIR/mysqlrun/mysql.sock" -uroot -e "select 1"
  mariadb --socket="$DIR/mysqlrun/mysql.sock" -uroot <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
}

start_daemon() {  # start_daemon NAME READY_CHECK... : start /usr/sbin/NAME in the background
  local name=$1; shift
  alive "$name" && return 0
  "/usr/sbin/$name" -D >>"$DIR/log/$name.out" 2>&1 &
  echo $! >"$DIR/pids/$name.pid"
  sleep 0.3
  alive "$name" || die "$name exited at start (see $DIR/log/$name.log and $name.out)"
}

install_packages
write_configs
start_munge
start_mariadb
start_daemon slurmdbd
wait_for 60 slurmdbd sacctmgr -i list cluster
start_daemon slurmctld
wait_for 60 slurmctld scontrol ping
sacctmgr -i list cluster format=cluster -n | grep -q twoclocks \
  || sacctmgr -i add cluster twoclocks >/dev/null 2>&1 || true
start_daemon slurmd
wait_for 60 "an idle node" sh -c "sinfo -h -N -o %t | grep -Eq '^(idle|mix|alloc)'"
wait_for 60 "accounting (sacct)" sacct -n -X -S now
log "up: node $NODE ($CPUS cpus), state in $DIR"
