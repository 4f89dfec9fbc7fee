#!/usr/bin/env bash
# Bring up a private, single-node Slurm cluster (with job accounting) on this
# machine, for tests of hydra-submitit-launcher / submitit jobs.
#
#   scripts/slurm/up.sh                        # start whatever is not running yet (idempotent)
#   scripts/slurm/up.sh --lease NAME [--pid P]  # ... and hold the cluster for process P (default: the caller)
#   scripts/slurm/up.sh --status               # exit 0 if every daemon runs, 1 if some, 3 if none
#
# Several users may share the cluster at once (two test sessions on one machine, say): up.sh and
# down.sh take turns through a lock file, so two starts never race for the same daemon, and each
# user holds a lease that down.sh --release gives back; the daemons stop only with the last lease.
# A plain up.sh holds a lease until a plain down.sh; a lease whose process has died counts for nothing.
#
# Everything it writes (configs, state, spool, logs, pid files, the database)
# lives under $LITLAB_SLURM_DIR (default /tmp/litlab-slurm); nothing under
# /etc is changed. Stop it with scripts/slurm/down.sh.
#
# Why accounting (MariaDB + slurmdbd): submitit polls `sacct` for job states.
# Without it the state reads UNKNOWN and a failed task makes job.result() hang.
#
# Needs root (slurmd launches jobs, munged must run as the munge user) and
# Debian's packages (installed with apt-get when missing).
#
# Tunables (environment):
#   LITLAB_SLURM_DIR       scratch folder                  (/tmp/litlab-slurm)
#   LITLAB_SLURM_CLUSTER   ClusterName                     (litlab)
#   LITLAB_SLURM_DB_PORT   private MariaDB port            (3307)
#   LITLAB_SLURMCTLD_PORT / LITLAB_SLURMD_PORT / LITLAB_SLURMDBD_PORT  (6817/6818/6819)
#   LITLAB_SLURM_TIMEOUT   seconds to wait for each daemon (60)
#   LITLAB_SLURM_LOCK_TIMEOUT  seconds to wait while another up.sh/down.sh runs (600: a first
#                              start installs packages)
set -euo pipefail

# shellcheck source=scripts/slurm/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
CLUSTER="${LITLAB_SLURM_CLUSTER:-litlab}"
DB_PORT="${LITLAB_SLURM_DB_PORT:-3307}"
CTLD_PORT="${LITLAB_SLURMCTLD_PORT:-6817}"
SLURMD_PORT="${LITLAB_SLURMD_PORT:-6818}"
DBD_PORT="${LITLAB_SLURMDBD_PORT:-6819}"
TIMEOUT="${LITLAB_SLURM_TIMEOUT:-60}"
PARTITION=debug

ETC="$DIR/etc"
LOG="$DIR/log"
MUNGE_DIR="$DIR/munge"
MUNGE_SOCKET="$MUNGE_DIR/munge.socket.2"
DB_DIR="$DIR/mysql"
DB_SOCKET="$DB_DIR/mysqld.sock"
SLURM_CONF_PATH="$ETC/slurm.conf"

# Every Slurm client and daemon (sbatch, sacctmgr, slurmdbd, ...) finds its
# config through SLURM_CONF; slurmdbd reads slurmdbd.conf from the same folder.
export SLURM_CONF="$SLURM_CONF_PATH"

DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)
USAGE="usage: up.sh [--status | --lease NAME [--pid PID]]"

status=0 lease=manual holder=""
while [[ $# -gt 0 ]]; do
    case "$1" in
    --status) status=1 ;;
    --lease) lease="${2:-}"; shift ;;
    --pid) holder="${2:-}"; shift ;;
    *) die "unknown argument: $1 ($USAGE)" ;;
    esac
    shift
done
[[ "$lease" =~ ^[A-Za-z0-9._-]+$ ]] || die "invalid lease name: '$lease' (letters, digits, . _ -)"
[[ -z "$holder" || "$holder" =~ ^[0-9]+$ ]] || die "invalid --pid: '$holder' (a process id)"
# A named lease without --pid belongs to whoever called up.sh.
[[ "$lease" == manual || -n "$holder" ]] || holder="$PPID"

if ((status)); then
    up=0
    for d in "${DAEMONS[@]}"; do
        if is_running "$d"; then echo "$d: running"; up=$((up + 1)); else echo "$d: stopped"; fi
    done
    for f in "$LEASES"/*; do
        [[ -e "$f" ]] || continue
        if lease_held "$f"; then echo "lease ${f##*/}: held"; else echo "lease ${f##*/}: stale"; fi
    done
    if ((up == ${#DAEMONS[@]})); then exit 0; elif ((up == 0)); then exit 3; else exit 1; fi
fi

take_lock

# show_log FILE: last lines of a daemon log, to make a failed start explainable.
show_log() {
    [[ -f "$1" ]] || return 0
    echo "----- last lines of $1 -----" >&2
    tail -n 25 "$1" >&2 || true
    echo "-----" >&2
}

# wait_for DESCRIPTION DAEMON LOGFILE CMD...: poll CMD (quietly) until it
# succeeds; fail with the daemon's log after $TIMEOUT seconds, or at once if
# DAEMON has died (a bad config makes Slurm daemons exit right away).
wait_for() {
    local what="$1" daemon="$2" logfile="$3"
    shift 3
    local deadline=$((SECONDS + TIMEOUT))
    until "$@" >/dev/null 2>&1; do
        if ! is_running "$daemon"; then
            show_log "$logfile"
            [[ "$logfile" == "$LOG/$daemon.out" ]] || show_log "$LOG/$daemon.out"
            die "$daemon exited while waiting for $what"
        fi
        if ((SECONDS >= deadline)); then
            show_log "$logfile"
            die "timed out after ${TIMEOUT}s waiting for $what"
        fi
        sleep 0.5
    done
}

# port_in_use PORT: something already listens on 127.0.0.1:PORT.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# require_free_port NAME PORT: fail unless PORT is free for daemon NAME.
require_free_port() {
    if port_in_use "$2"; then
        die "port $2 (for $1) is already in use by another program; stop it or set the LITLAB_* port variable"
    fi
}

# start_daemon NAME LOGFILE CMD...: run CMD in the foreground mode of the
# daemon, detached (own session, no inherited stdio, so callers such as
# pytest's subprocess.run do not wait on our pipes, and without the lock on
# fd 9, which it would otherwise hold for as long as it runs), and record its pid.
# The record is ours alone: each daemon writes its own pid file (NAME.own.pid, set below), and
# sharing one would let wait_for read it while the daemon truncates it and call a live daemon dead.
start_daemon() {
    local name="$1" logfile="$2"
    shift 2
    setsid "$@" </dev/null >>"$logfile" 2>&1 9>&- &
    local pid=$! i
    echo "$pid" >"$RUN/$name.pid"
    # Until it has exec'd, the child still shows up as bash/setsid/setpriv;
    # wait for that so that is_running (which checks the name) is accurate.
    for ((i = 0; i < 100; i++)); do
        [[ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" == "$name" ]] && return 0
        alive "$pid" || return 0
        sleep 0.05
    done
}

# write_if_changed FILE MODE: write stdin to FILE only when the content
# differs, so a re-run does not touch configs that running daemons use.
# CONFIG_CHANGED=1 records that it wrote one (running daemons are told, below).
CONFIG_CHANGED=0
write_if_changed() {
    local file="$1" mode="$2" tmp
    tmp="$(mktemp "$file.XXXXXX")"
    cat >"$tmp"
    chmod "$mode" "$tmp"
    if [[ -f "$file" ]] && cmp -s "$tmp" "$file"; then
        rm -f "$tmp"
    else
        mv -f "$tmp" "$file"
        CONFIG_CHANGED=1
    fi
}

# --- preconditions -----------------------------------------------------------

[[ "$(id -u)" -eq 0 ]] || die "must run as root (slurmd launches jobs as their user; munged runs as 'munge')"

# --- 1. packages -------------------------------------------------------------

need_install=0
for bin in munged munge unmunge slurmctld slurmd sbatch srun sacct sacctmgr slurmdbd mariadbd mariadb mysql_install_db; do
    command -v "$bin" >/dev/null 2>&1 || [[ -x "/usr/sbin/$bin" ]] || { need_install=1; break; }
done
if ((need_install)); then
    command -v apt-get >/dev/null 2>&1 || die "Slurm/MariaDB are not installed and apt-get is not available"
    PKGS=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
    # Without systemd nothing should start at install time; the Docker-style
    # policy-rc.d makes sure of that. Add one only for the install if absent.
    added_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        added_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    log "installing ${PKGS[*]} (one-time, takes a minute or two)"
    # Try with the package lists we have; refresh them once only if that fails
    # (missing or stale lists).
    if ! apt-get install -y -q --no-install-recommends "${PKGS[@]}" >"/tmp/litlab-slurm-apt.log" 2>&1; then
        log "apt-get install failed; running apt-get update once and retrying"
        apt-get update -q >>"/tmp/litlab-slurm-apt.log" 2>&1 || true
        if ! apt-get install -y -q --no-install-recommends "${PKGS[@]}" >>"/tmp/litlab-slurm-apt.log" 2>&1; then
            if ((added_policy)); then rm -f /usr/sbin/policy-rc.d; fi
            tail -n 20 /tmp/litlab-slurm-apt.log >&2
            die "apt-get install ${PKGS[*]} failed (full log: /tmp/litlab-slurm-apt.log)"
        fi
    fi
    if ((added_policy)); then rm -f /usr/sbin/policy-rc.d; fi
fi

# --- 2. scratch layout -------------------------------------------------------

# munged runs as 'munge' and must be able to traverse $DIR: make it 755 when
# we create it (whatever the umask); an existing folder is left as it is.
if [[ ! -d "$DIR" ]]; then
    mkdir -p "$(dirname "$DIR")"
    mkdir -m 755 "$DIR"
fi
mkdir -p "$ETC" "$RUN" "$LOG" "$LEASES" "$DIR/state" "$DIR/spool" "$DIR/tmp" "$MUNGE_DIR" "$DB_DIR"
chmod 1777 "$DIR/tmp"
# Marks the folder as ours: down.sh --purge deletes only such a folder.
touch "$DIR/.litlab-slurm"

for p in "$DB_PORT" "$DBD_PORT" "$CTLD_PORT" "$SLURMD_PORT"; do
    if ! [[ "$p" =~ ^[0-9]+$ ]] || ((p < 1 || p > 65535)); then die "invalid port number: $p"; fi
done
# A foreign server on one of our ports would make a daemon fail later with an
# obscure bind error (or, worse, we would talk to it): check them all first.
for spec in "mariadbd:$DB_PORT" "slurmdbd:$DBD_PORT" "slurmctld:$CTLD_PORT" "slurmd:$SLURMD_PORT"; do
    is_running "${spec%%:*}" || require_free_port "${spec%%:*}" "${spec##*:}"
done

# --- 3. munge (authentication for every Slurm message) -----------------------

# The package creates /etc/munge/munge.key; recreate it only if it is gone.
MUNGE_KEY=/etc/munge/munge.key
if [[ ! -s "$MUNGE_KEY" ]]; then
    log "creating $MUNGE_KEY"
    install -d -o munge -g munge -m 700 /etc/munge
    mungekey --create --keyfile="$MUNGE_KEY"
    chown munge:munge "$MUNGE_KEY"
    chmod 400 "$MUNGE_KEY"
fi
# munged refuses a socket/log folder that others can write to, and must own it.
chown munge:munge "$MUNGE_DIR"
chmod 755 "$MUNGE_DIR"
if ! is_running munged; then
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    # -F: stay in the foreground so that $! is munged's pid (it then logs to
    # stderr, i.e. munged.out); setpriv drops to the munge user without
    # forking (runuser/su would stay as the parent).
    # The socket is private, so a system munged (if any) is not disturbed.
    start_daemon munged "$LOG/munged.out" \
        setpriv --reuid=munge --regid=munge --init-groups \
        munged -F --key-file="$MUNGE_KEY" --socket="$MUNGE_SOCKET" \
        --pid-file="$MUNGE_DIR/munged.pid" --seed-file="$MUNGE_DIR/munged.seed"
fi
munge_ok() { munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET"; }
wait_for "munged (munge -n | unmunge)" munged "$LOG/munged.out" munge_ok

# --- 4. MariaDB (private instance, storage for slurmdbd) ---------------------

DB_PASS_FILE="$ETC/db.pass"
if [[ ! -s "$DB_PASS_FILE" ]]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$DB_PASS_FILE")
fi
DB_PASS="$(cat "$DB_PASS_FILE")"

if [[ ! -d "$DB_DIR/data/mysql" ]]; then
    log "initialising MariaDB data directory"
    rm -rf "$DB_DIR/data"
    # --no-defaults: ignore /etc/mysql so that a system MariaDB config (or
    # none) does not matter. root logs in through the unix socket only.
    mysql_install_db --no-defaults --datadir="$DB_DIR/data" --user=root \
        --auth-root-authentication-method=socket --skip-test-db \
        >"$LOG/mysql_install_db.log" 2>&1 ||
        { show_log "$LOG/mysql_install_db.log"; die "mysql_install_db failed"; }
fi

if ! is_running mariadbd; then
    rm -f "$DB_SOCKET"
    # Small footprint (2-core test machine); redo log size and lock timeout as
    # slurmdbd recommends (it still logs "not recommended" for the buffer
    # pool, which is harmless at this size).
    # Native AIO off because some sandboxes lack it; a handful of rows.
    start_daemon mariadbd "$LOG/mariadb.out" \
        mariadbd --no-defaults --datadir="$DB_DIR/data" --user=root \
        --bind-address=127.0.0.1 --port="$DB_PORT" --socket="$DB_SOCKET" \
        --pid-file="$RUN/mariadbd.own.pid" --log-error="$LOG/mariadb.log" \
        --tmpdir="$DIR/tmp" --skip-name-resolve --skip-log-bin \
        --innodb-buffer-pool-size=128M --innodb-log-file-size=64M \
        --innodb-lock-wait-timeout=900 --innodb-use-native-aio=0 \
        --max-connections=50 --performance-schema=OFF
fi
db_root() { mariadb --no-defaults -S "$DB_SOCKET" -uroot "$@"; }
wait_for "MariaDB on 127.0.0.1:$DB_PORT" mariadbd "$LOG/mariadb.log" db_root -e 'SELECT 1'
# Idempotent: the account slurmdbd uses, reachable over TCP on localhost only.
db_root --batch <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL

# --- 5. Slurm configuration --------------------------------------------------

# The node line is what slurmd detects here (CPUs, sockets, RealMemory ...).
NODE_LINE="$(slurmd -C | head -n 1)"
[[ "$NODE_LINE" == NodeName=* ]] || die "unexpected 'slurmd -C' output: $NODE_LINE"
# The node offers 4 cores for each one it has (CoresPerSocket x4, CPUs x4; SlurmdParameters=
# config_overrides below makes slurmctld trust the line): jobs of tests running on several pytest
# workers share the cores side by side, as the workers themselves do, instead of queueing behind each
# other's jobs. (Cores, not threads: a job of several tasks is given whole cores.)
[[ "$NODE_LINE" =~ CPUs=([0-9]+) ]] && DETECTED_CPUS="${BASH_REMATCH[1]}"
[[ "$NODE_LINE" =~ CoresPerSocket=([0-9]+) ]] && DETECTED_CORES="${BASH_REMATCH[1]}"
[[ -n "${DETECTED_CPUS:-}" && -n "${DETECTED_CORES:-}" ]] || die "no CPUs/CoresPerSocket in: $NODE_LINE"
NODE_LINE="${NODE_LINE/CPUs=$DETECTED_CPUS/CPUs=$((DETECTED_CPUS * 4))}"
NODE_LINE="${NODE_LINE/CoresPerSocket=$DETECTED_CORES/CoresPerSocket=$((DETECTED_CORES * 4))}"
NODE_NAME="${NODE_LINE#NodeName=}"
NODE_NAME="${NODE_NAME%% *}"
CTLD_HOST="$(hostname -s)"

write_if_changed "$SLURM_CONF_PATH" 644 <<EOF
# Generated by scripts/slurm/up.sh -- single-node test cluster. Do not edit.
ClusterName=$CLUSTER
SlurmctldHost=$CTLD_HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT

AuthType=auth/munge
CredType=cred/munge
# Our munged listens on a private socket; daemons and clients both read this. cred_expire: a
# requeued job waits this long before it starts again (Slurm's default, 120 s, would make every
# requeue test wait two minutes).
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
MpiDefault=none
SwitchType=switch/none

# No systemd/cgroups here: track processes through /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none

# Allocate CPUs only. Memory is not a consumable resource, so jobs that do not
# ask for --mem run; RealMemory still bounds what a --mem request may ask.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Trust the node line below even if slurmd later detects a little less memory,
# instead of draining the only node.
SlurmdParameters=config_overrides

StateSaveLocation=$DIR/state/slurmctld
SlurmdSpoolDir=$DIR/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.own.pid
SlurmdPidFile=$RUN/slurmd.own.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info

# A job that waits (a requeued one, for cred_expire) starts within a second of being eligible, not at
# the next pass of the main (60 s) or backfill (30 s) scheduling loop.
SchedulerParameters=sched_interval=1,bf_interval=1

MailProg=/bin/true
# The node comes back by itself after a restart of the cluster.
ReturnToService=2
# Quick cancels/timeouts in tests.
KillWait=5
InactiveLimit=0
MinJobAge=300

# Job accounting through slurmdbd (submitit reads job states with sacct).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
JobCompType=jobcomp/none

$NODE_LINE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE_NAME Default=YES MaxTime=INFINITE State=UP
EOF

# slurmdbd.conf holds the DB password: slurmdbd insists on mode 600, owned by
# SlurmUser (root).
write_if_changed "$ETC/slurmdbd.conf" 600 <<EOF
# Generated by scripts/slurm/up.sh -- do not edit.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$CTLD_HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.own.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF

mkdir -p "$DIR/state/slurmctld" "$DIR/spool/slurmd"

# --- 6. slurmdbd + cluster registration --------------------------------------

if ! is_running slurmdbd; then
    start_daemon slurmdbd "$LOG/slurmdbd.out" slurmdbd -D
fi
wait_for "slurmdbd on 127.0.0.1:$DBD_PORT" slurmdbd "$LOG/slurmdbd.out" \
    sacctmgr -n -P list cluster format=cluster

# Register the cluster once (before slurmctld starts, so that it is accounted).
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi

# --- 7. slurmctld + slurmd ---------------------------------------------------

# A cluster already up with an older slurm.conf (this script changed): restart slurmctld, which
# keeps its jobs (state in StateSaveLocation, slurmd keeps running them); `scontrol reconfigure`
# would not apply AuthInfo's cred_expire.
if ((CONFIG_CHANGED)) && pid="$(pid_of slurmctld)"; then
    log "slurm.conf changed: restarting slurmctld (pid $pid); running jobs continue"
    kill -TERM "$pid"
    while alive "$pid"; do sleep 0.1; done
fi
if ! is_running slurmctld; then
    start_daemon slurmctld "$LOG/slurmctld.out" slurmctld -D
fi
wait_for "slurmctld on 127.0.0.1:$CTLD_PORT" slurmctld "$LOG/slurmctld.out" scontrol ping

if ! is_running slurmd; then
    start_daemon slurmd "$LOG/slurmd.out" slurmd -D
fi

# Ready = the node is schedulable and accounting answers.
node_ready() {
    local state
    state="$(sinfo -h -N -n "$NODE_NAME" -o '%T')"
    [[ "$state" =~ ^(idle|mixed|allocated|completing)$ ]]
}
wait_for "node $NODE_NAME to be idle in sinfo" slurmd "$LOG/slurmd.out" node_ready
wait_for "sacct to answer" slurmdbd "$LOG/slurmdbd.out" sacct -n -X

# The lease: the holder's pid and start time (a pid alone may be reused), or nothing for a
# plain up.sh, whose lease only a plain down.sh ends.
if [[ -n "$holder" ]]; then
    alive "$holder" || die "--pid $holder: no such process"
    echo "$holder $(start_time "$holder")" >"$LEASES/$lease"
else
    : >"$LEASES/$lease"
fi

log "cluster '$CLUSTER' is up (node $NODE_NAME, partition $PARTITION, scratch $DIR, lease $lease)"
echo "export SLURM_CONF=$SLURM_CONF_PATH"
