# shellcheck shell=bash
# Docker engine for the test hosts: start one when none answers, and stop
# only the engine this script started.

SPECFLEET_DOCKERD_PID=""

docker_ensure() {
    if docker info >/dev/null 2>&1; then
        return 0
    fi
    echo "specfleet: no Docker engine answers; starting dockerd" >&2
    dockerd >/var/log/specfleet-dockerd.log 2>&1 &
    SPECFLEET_DOCKERD_PID=$!
    for _ in $(seq 60); do
        if docker info >/dev/null 2>&1; then
            return 0
        fi
        sleep 1
    done
    echo "specfleet: dockerd did not answer within 60 s; see /var/log/specfleet-dockerd.log" >&2
    return 1
}

docker_stop_if_started() {
    if [[ -n $SPECFLEET_DOCKERD_PID ]]; then
        # Silent: pytest's summary stays the run's last line.
        kill "$SPECFLEET_DOCKERD_PID" 2>/dev/null || true
        wait "$SPECFLEET_DOCKERD_PID" 2>/dev/null || true
        SPECFLEET_DOCKERD_PID=""
    fi
}
