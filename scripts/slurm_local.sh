#!/usr/bin/env bash
# A single-node SLURM cluster on this machine (slurmctld + slurmd + slurmdbd on localhost, MariaDB for the
# accounting that `sacct`, and so submitit, reads), for the `slurm` test group and for trying the SLURM
# launcher without a cluster. Everything lives in one state folder; nothing under /etc is written.
#
#   scripts/slurm_local.sh start    # install slurm-wlm, slurmdbd, munge, mariadb-server if missing; start;
#                                   # wait until sinfo shows the node idle; print the `export SLURM_CONF=...`
#   scripts/slurm_local.sh status   # sinfo and squeue of the local cluster (exit 1 when it is not running)
#   scripts/slurm_local.sh stop     # stop every daemon it started (by their pid files) and remove the folder
#   scripts/slurm_local.sh env      # the `export SLURM_CONF=...` line alone
#
# Exit status of `start`: 0 running; 3 the packages are missing and cannot be installed (not root, or apt
# failed: the reason is printed); 1 another failure (the daemons' logs are printed).
# Environment: KEYFORMER_SLURM_DIR (state folder, default /tmp/keyformer-slurm), KEYFORMER_SLURM_PORT (first
# of four TCP ports on 127.0.0.1: slurmctld, slurmd, slurmdbd, mariadb; default 16817), KEYFORMER_SLURM_NO_INSTALL=1
# (never run apt-get). Runs as root (SlurmUser=root); the node is this machine's cores and memory (`slurmd -C`),
# proctrack/linuxproc and task/none (no cgroups or systemd needed). Clients need SLURM_CONF=$DIR/etc/slurm.conf.
set -euo pipefail

DIR="${KEYFORMER_SLURM_DIR:-/tmp/keyformer-slurm}"
PORT="${KEYFORMER_SLURM_PORT:-16817}"
CTLD_PORT="$PORT" SLURMD_PORT="$((PORT + 1))" DBD_PORT="$((PORT + 2))" DB_PORT="$((PORT + 3))"
CLUSTER=keyformer
NODE=localnode
PARTITION=debug
export SLURM_CONF="$DIR/etc/slurm.conf"
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
NEEDED=(slurmctld slurmd slurmdbd munged sinfo sbatch sacct sacctmgr mariadbd mariadb-install-db mariadb)

say() { echo "[slurm_local] $*" >&2; }

missing() {
  local m=()
  for c in "${NEEDED[@]}"; do
    PATH="$PATH:/usr/sbin:/sbin" command -v "$c" >/dev/null 2>&1 || m+=("$c")
  done
  echo "${m[*]}"
}

install() {
  local m
  m="$(missing)"
  [ -z "$m" ] && return 0
  if [ "${KEYFORMER_SLURM_NO_INSTALL:-0}" = 1 ]; then
    say "cannot start: missing $m and KEYFORMER_SLURM_NO_INSTALL=1"; return 3
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "cannot start: missing $m; installing ${PACKAGES[*]} needs root and apt-get"; return 3
  fi
  say "installing ${PACKAGES[*]} (missing: $m)"
  local log="/tmp/keyformer-slurm-apt.$$.log"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
       -o DPkg::Lock::Timeout=300 "${PACKAGES[@]}" >"$log" 2>&1; then
    # a stale package list: refresh it once and retry
    if ! { apt-get update -q >>"$log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
           --no-install-recommends -o DPkg::Lock::Timeout=300 "${PACKAGES[@]}" >>"$log" 2>&1; }; then
      say "cannot start: apt-get install ${PACKAGES[*]} failed: $(tail -n 3 "$log" | tr '\n' ' ')"
      rm -f "$log"; return 3
    fi
  fi
  rm -f "$log"
  m="$(missing)"
  if [ -n "$m" ]; then say "cannot start: still missing after apt-get: $m"; return 3; fi
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# The state folder is ours before anything in it is read, run or killed: a real folder (no symlink), owned by
# this user, writable by no one else; made private (0700) when absent. Another user's folder is refused.
own_dir() {  # own_dir [check]: with "check", an absent folder is left absent
  if [ ! -e "$DIR" ] && [ ! -L "$DIR" ]; then
    [ "${1:-}" = check ] && return 0
    (umask 077 && mkdir "$DIR") 2>/dev/null || true
  fi
  if [ -L "$DIR" ] || [ ! -d "$DIR" ]; then say "refusing $DIR: not a folder (or a symlink); set KEYFORMER_SLURM_DIR"; exit 1; fi
  local owner mode
  owner="$(stat -c %u "$DIR")" mode="$(stat -c %a "$DIR")"
  if [ "$owner" != "$(id -u)" ]; then
    say "refusing $DIR: owned by uid $owner, not by this user ($(id -u)); set KEYFORMER_SLURM_DIR"; exit 1
  fi
  if [ $((8#$mode & 8#022)) -ne 0 ]; then
    say "refusing $DIR: writable by others (mode $mode); set KEYFORMER_SLURM_DIR or chmod go-w it"; exit 1
  fi
}

# a daemon's pid, only when its pid file names a live process of that daemon (a reused pid is left alone)
daemon_pid() {  # daemon_pid NAME
  local f="$DIR/run/$1.pid" pid
  pid_alive "$f" || return 1
  pid="$(cat "$f")"
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] || return 1
  echo "$pid"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local t="$1" what="$2"; shift 2
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$end" ]; then say "timed out after ${t}s waiting for $what"; return 1; fi
    sleep 0.5
  done
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_configs() {
  local node cpus mem
  node="$(slurmd -C | head -n 1)"
  cpus="$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node")"
  mem="$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")"
  mem=$((mem * 9 / 10))  # leave the OS and the daemons a tenth
  mkdir -p "$DIR"/{etc,munge,mysql,ctld,spool,log,run}
  chmod 755 "$DIR/munge"  # the socket's folder: clients need to reach it; the key itself is 0400
  cat >"$DIR/etc/slurm.conf" <<EOF
# written by scripts/slurm_local.sh: a one-node cluster on localhost
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
SchedulerParameters=sched_interval=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=1
MinJobAge=300
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$DIR/munge/munge.socket
NodeName=$NODE NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=keyformer
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$DIR/etc/slurmdbd.conf"
}

start() {
  install || return $?
  export PATH="$PATH:/usr/sbin:/sbin"
  if pid_alive "$DIR/run/slurmctld.pid"; then
    say "already running ($DIR)"; wait_idle; echo "export SLURM_CONF=$SLURM_CONF"; return 0
  fi
  stop_daemons
  for p in "$CTLD_PORT" "$SLURMD_PORT" "$DBD_PORT" "$DB_PORT"; do
    port_free "$p" || { say "port $p on 127.0.0.1 is taken: set KEYFORMER_SLURM_PORT"; return 1; }
  done
  rm -rf "$DIR"
  own_dir
  write_configs
  say "starting in $DIR"
  # munge: a fresh key, its own socket
  dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$DIR/munge/munge.key"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
    </dev/null >/dev/null 2>&1
  wait_for 20 munged munge --socket="$DIR/munge/munge.socket" -n || fail
  # accounting: MariaDB on 127.0.0.1, then slurmdbd
  mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user=root --skip-test-db \
    --auth-root-authentication-method=socket >"$DIR/log/mariadb-install.log" 2>&1 || fail
  mariadbd --no-defaults --datadir="$DIR/mysql" --socket="$DIR/run/mysqld.sock" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --user=root --pid-file="$DIR/run/mariadbd.pid" --log-error="$DIR/log/mariadb.log" \
    --innodb-buffer-pool-size=32M --skip-log-bin </dev/null >/dev/null 2>&1 &
  wait_for 60 mariadb mariadb --no-defaults --socket="$DIR/run/mysqld.sock" -u root -e "select 1" || fail
  mariadb --no-defaults --socket="$DIR/run/mysqld.sock" -u root -e \
    "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'keyformer'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" \
    || fail
  slurmdbd </dev/null >/dev/null 2>&1
  wait_for 60 slurmdbd sacctmgr -n list cluster || fail
  sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail
  slurmctld </dev/null >/dev/null 2>&1
  wait_for 60 slurmctld scontrol ping || fail
  slurmd -N "$NODE" </dev/null >/dev/null 2>&1
  wait_idle || fail
  say "running: $(sinfo -h -o '%P %D %t %c CPUs %m MB')"
  echo "export SLURM_CONF=$SLURM_CONF"
}

node_idle() { [ "$(sinfo -h -n "$NODE" -o %t 2>/dev/null)" = idle ]; }

wait_idle() { wait_for 60 "the node to be idle (sinfo)" node_idle; }

fail() {
  say "failed to start; logs follow"
  for f in "$DIR"/log/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 20 "$f" >&2; }; done
  stop_daemons
  exit 1
}

stop_daemons() {  # each daemon by its pid file, newest first
  for d in slurmd slurmctld slurmdbd mariadbd munged; do
    local pid
    if pid="$(daemon_pid "$d")"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
  done
}

stop() {
  [ -d "$DIR" ] || { say "not running ($DIR absent)"; return 0; }
  export PATH="$PATH:/usr/sbin:/sbin"
  if pid_alive "$DIR/run/slurmctld.pid"; then
    scancel --full -u "$(id -un)" 2>/dev/null || true  # jobs of this cluster only (SLURM_CONF)
  fi
  stop_daemons
  rm -rf "$DIR"
  say "stopped"
}

status() {
  pid_alive "$DIR/run/slurmctld.pid" || { say "not running ($DIR)"; return 1; }
  sinfo
  squeue
}

case "${1:-}" in
  start) own_dir ;;
  stop|status) own_dir check ;;
esac
case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
