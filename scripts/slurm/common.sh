# shellcheck shell=bash disable=SC2034  # (variables used by the scripts that source this)
# Sourced by up.sh and down.sh: the scratch folder, the pid-file and lease checks, and the lock
# that makes the two take turns.

DIR="${LITLAB_SLURM_DIR:-/tmp/litlab-slurm}"
RUN="$DIR/run"
LEASES="$DIR/leases"
# Beside the folder, not in it: down.sh --purge deletes the folder while it holds the lock.
LOCK="$DIR.lock"
LOCK_TIMEOUT="${LITLAB_SLURM_LOCK_TIMEOUT:-600}"
export PATH="$PATH:/usr/sbin:/sbin"

log() { echo "litlab-slurm: $*" >&2; }
die() { echo "litlab-slurm: ERROR: $*" >&2; exit 1; }

# alive PID: the process exists and is not a zombie (the daemons are not our children, and PID 1
# here may be slow to reap them; a zombie has exited).
alive() {
    local state
    kill -0 "$1" 2>/dev/null || return 1
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# start_time PID: when the process started (field 22 of /proc/PID/stat, counted after the
# command name, which may contain spaces). A pid and its start time name one process for good.
start_time() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $20}'; }

# pid_of NAME: print the pid in $RUN/NAME.pid if it is a live NAME process (guards against a
# stale pid reused by something else).
pid_of() {
    local name="$1" pid comm
    [[ -s "$RUN/$name.pid" ]] || return 1
    pid="$(tr -dc '0-9' <"$RUN/$name.pid")"
    [[ -n "$pid" ]] && alive "$pid" || return 1
    comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
    [[ "$comm" == "$name" ]] || return 1
    echo "$pid"
}

is_running() { pid_of "$1" >/dev/null; }

# lease_held FILE: the lease still counts. An empty lease (a plain up.sh) lasts until a plain
# down.sh; otherwise it holds "PID START_TIME" and lasts while that process runs.
lease_held() {
    local pid started
    [[ -s "$1" ]] || return 0
    read -r pid started <"$1" || return 1
    [[ -n "$pid" ]] && alive "$pid" && [[ "$(start_time "$pid")" == "$started" ]]
}

# take_lock: wait until no other up.sh/down.sh runs, then hold the lock on fd 9 until this script
# ends. Two starts at once would each start the daemons, and a Slurm daemon that starts kills the
# one named in its pid file; a stop during a start would pull the cluster from under it.
take_lock() {
    mkdir -p "$(dirname "$DIR")"
    exec 9>"$LOCK"
    flock -w "$LOCK_TIMEOUT" 9 || die "$LOCK is still held after ${LOCK_TIMEOUT}s by another up.sh/down.sh"
}
