#!/usr/bin/env bash
# Stop the private Slurm cluster that scripts/slurm/up.sh started.
#
#   scripts/slurm/down.sh                 # stop every daemon, whoever holds a lease; keep $LITLAB_SLURM_DIR
#   scripts/slurm/down.sh --purge         # ... and delete $LITLAB_SLURM_DIR
#   scripts/slurm/down.sh --release NAME  # give back lease NAME; stop only if no other lease is held
#
# Only processes recorded in $LITLAB_SLURM_DIR/run/*.pid are signalled (and
# only if the pid still belongs to the daemon of that name), so a system Slurm
# or MariaDB on the same machine is never touched. Safe to run when nothing is
# up. Keeping the folder makes the next up.sh faster (database already made).
set -euo pipefail

# shellcheck source=scripts/slurm/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
STOP_TIMEOUT="${LITLAB_SLURM_STOP_TIMEOUT:-30}"
export SLURM_CONF="$DIR/etc/slurm.conf"

USAGE="usage: down.sh [--purge | --release NAME]"
purge=0 release=""
case "${1:-}" in
"") ;;
--purge) purge=1 ;;
--release)
    release="${2:-}"
    [[ "$release" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "invalid lease name: '$release' ($USAGE)" >&2; exit 2; }
    ;;
*) echo "$USAGE" >&2; exit 2 ;;
esac

take_lock

if [[ -n "$release" ]]; then
    rm -f "$LEASES/$release"
    # A holder that died without giving its lease back (a killed test session) holds nothing.
    held=()
    for f in "$LEASES"/*; do
        [[ -e "$f" ]] || continue
        if lease_held "$f"; then held+=("${f##*/}"); else rm -f "$f"; fi
    done
    if ((${#held[@]})); then
        log "released lease $release; the cluster stays up for: ${held[*]}"
        exit 0
    fi
fi
rm -rf "$LEASES"

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
