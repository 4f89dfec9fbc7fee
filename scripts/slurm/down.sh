#!/usr/bin/env bash
# Stop the private Slurm cluster that scripts/slurm/up.sh started.
#
#   scripts/slurm/down.sh           # stop every daemon, keep $LITLAB_SLURM_DIR
#   scripts/slurm/down.sh --purge   # ... and delete $LITLAB_SLURM_DIR
#
# Only processes recorded in $LITLAB_SLURM_DIR/run/*.pid are signalled (and
# only if the pid still belongs to the daemon of that name), so a system Slurm
# or MariaDB on the same machine is never touched. Safe to run when nothing is
# up. Keeping the folder makes the next up.sh faster (database already made).
set -euo pipefail

DIR="${LITLAB_SLURM_DIR:-/tmp/litlab-slurm}"
RUN="$DIR/run"
STOP_TIMEOUT="${LITLAB_SLURM_STOP_TIMEOUT:-30}"
export SLURM_CONF="$DIR/etc/slurm.conf"
export PATH="$PATH:/usr/sbin:/sbin"

log() { echo "litlab-slurm: $*" >&2; }

purge=0
case "${1:-}" in
"") ;;
--purge) purge=1 ;;
*) echo "usage: down.sh [--purge]" >&2; exit 2 ;;
esac

# pid_of NAME: print the pid in $RUN/NAME.pid if it is a live NAME process.
pid_of() {
    local name="$1" pid comm
    [[ -s "$RUN/$name.pid" ]] || return 1
    pid="$(tr -dc '0-9' <"$RUN/$name.pid")"
    [[ -n "$pid" ]] && alive "$pid" || return 1
    comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
    [[ "$comm" == "$name" ]] || return 1
    echo "$pid"
}

# alive PID: the process exists and is not a zombie. Our daemons are not our
# children, and PID 1 here may take a while to reap them; a zombie has exited.
alive() {
    local state
    kill -0 "$1" 2>/dev/null || return 1
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# stop NAME: SIGTERM, wait up to $STOP_TIMEOUT s for the exit, then SIGKILL.
stop() {
    local name="$1" pid deadline
    if pid="$(pid_of "$name")"; then
        kill -TERM "$pid" 2>/dev/null || true
        deadline=$((SECONDS + STOP_TIMEOUT))
        while alive "$pid"; do
            if ((SECONDS >= deadline)); then
                log "$name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT}s; killing it"
                kill -KILL "$pid" 2>/dev/null || true
                while alive "$pid"; do sleep 0.1; done
                break
            fi
            sleep 0.1
        done
        log "stopped $name (pid $pid)"
    fi
    rm -f "$RUN/$name.pid"
}

# Running jobs would leave slurmstepd processes (and their children) behind
# once slurmd is gone: cancel them first and give them a moment to end.
if pid_of slurmctld >/dev/null && command -v squeue >/dev/null; then
    jobs="$(squeue -h -o '%i' 2>/dev/null || true)"
    if [[ -n "$jobs" ]]; then
        log "cancelling jobs: $(echo "$jobs" | tr '\n' ' ')"
        # shellcheck disable=SC2086  # one job id per word
        scancel $jobs 2>/dev/null || true
        deadline=$((SECONDS + 20))
        while [[ -n "$(squeue -h -o '%i' 2>/dev/null || true)" ]] && ((SECONDS < deadline)); do
            sleep 0.5
        done
    fi
fi

# Reverse start order: slurmctld flushes job records to slurmdbd on exit,
# slurmdbd needs MariaDB, and all of them authenticate through munged.
for d in slurmd slurmctld slurmdbd mariadbd munged; do
    stop "$d"
done

if ((purge)) && [[ -d "$DIR" ]]; then
    # Refuse to delete a folder up.sh did not make (e.g. LITLAB_SLURM_DIR=/tmp).
    [[ -e "$DIR/.litlab-slurm" ]] || { log "not purging $DIR: no .litlab-slurm marker"; exit 1; }
    rm -rf "$DIR"
    log "removed $DIR"
fi
