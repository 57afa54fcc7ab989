#!/bin/sh
# warren preStop drain: wait until the node has no running sandboxes, but never past a deadline.
#
# The kubelet runs this before it sends SIGTERM, and it counts against
# terminationGracePeriodSeconds. Waiting for 0 with no bound would spend the whole grace
# period here and leave the server no time for its own SIGTERM shutdown (pausing and
# persisting what is left) before the SIGKILL. So the deadline (DRAIN_DEADLINE_S, 3000 s of
# the manifest's 3600 s) is checked at the top of every iteration, whether the last poll
# worked or not: an unreachable or failing API is retried, never a reason to stop early,
# and never a way around the deadline. At the deadline the script says so and exits 0.
#
# Precision: time is `date +%s`, whole seconds, so the script may stop up to 1 s before the
# nominal deadline, and after it by at most one DRAIN_POLL_S sleep plus one request
# (curl: DRAIN_HTTP_TIMEOUT_S; wget: that per connect and per read).
#
# Environment:
#   DRAIN_DEADLINE_S      give up after this many seconds (integer, default 3000)
#   DRAIN_POLL_S          pause between polls (default 5; fractions work with GNU/busybox sleep)
#   DRAIN_HTTP_TIMEOUT_S  per-request timeout (integer, default 5)
#   DRAIN_URL             default http://127.0.0.1:3000/v2/sandboxes?state=running
#                         (paused sandboxes are persisted on the node; only running ones drain)
#   DRAIN_HTTP            curl | wget (default: curl if installed, else wget)
#   WARREN_API_KEY        sent as X-API-Key; else read from $WARREN_STATE_DIR/api-key
#   WARREN_STATE_DIR      default /var/lib/warren
#   DRAIN_LOG_PID_FILE    a file whose first line is a pid (the server's instance lock): log to
#                         that process's stdout, i.e. the container log, if it is in our
#                         container (same mount namespace). The kubelet keeps a hook's own
#                         output only when the hook fails, and with hostPID PID 1 is the host's.
#
# POSIX sh; runs under dash and busybox sh.

set -u

say() {
    printf '%s warren-drain: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"
}

is_uint() {
    case "$1" in
        '' | *[!0-9]*) return 1 ;;
        *) return 0 ;;
    esac
}

if [ -n "${DRAIN_LOG_PID_FILE:-}" ]; then
    log_pid=$(head -n 1 "$DRAIN_LOG_PID_FILE" 2>/dev/null)
    if is_uint "${log_pid:-}" && [ "$(readlink "/proc/$log_pid/ns/mnt" 2>/dev/null)" = "$(readlink /proc/self/ns/mnt)" ]; then
        # `command` keeps a failed redirection from ending the script: then we log to our stdout.
        command exec >>"/proc/$log_pid/fd/1" 2>&1
    fi
fi

DRAIN_DEADLINE_S=${DRAIN_DEADLINE_S:-3000}
DRAIN_POLL_S=${DRAIN_POLL_S:-5}
DRAIN_HTTP_TIMEOUT_S=${DRAIN_HTTP_TIMEOUT_S:-5}
DRAIN_URL=${DRAIN_URL:-http://127.0.0.1:3000/v2/sandboxes?state=running}
WARREN_STATE_DIR=${WARREN_STATE_DIR:-/var/lib/warren}

if ! is_uint "$DRAIN_DEADLINE_S"; then
    say "error: DRAIN_DEADLINE_S must be a whole number of seconds, got '$DRAIN_DEADLINE_S'"
    exit 2
fi
if ! is_uint "$DRAIN_HTTP_TIMEOUT_S"; then
    say "error: DRAIN_HTTP_TIMEOUT_S must be a whole number of seconds, got '$DRAIN_HTTP_TIMEOUT_S'"
    exit 2
fi

if [ -z "${DRAIN_HTTP:-}" ]; then
    if command -v curl >/dev/null 2>&1; then
        DRAIN_HTTP=curl
    elif command -v wget >/dev/null 2>&1; then
        DRAIN_HTTP=wget
    else
        say "error: neither curl nor wget is installed; cannot poll the sandbox API"
        exit 2
    fi
fi
case "$DRAIN_HTTP" in
    curl | wget) ;;
    *)
        say "error: DRAIN_HTTP must be curl or wget, got '$DRAIN_HTTP'"
        exit 2
        ;;
esac

api_key=${WARREN_API_KEY:-}
if [ -z "$api_key" ] && [ -r "$WARREN_STATE_DIR/api-key" ]; then
    api_key=$(cat "$WARREN_STATE_DIR/api-key")
fi
if [ -z "$api_key" ]; then
    say "warning: no API key (WARREN_API_KEY or $WARREN_STATE_DIR/api-key); polls will be refused"
fi

# Print the response body on success; print why and fail otherwise.
fetch() {
    if [ "$DRAIN_HTTP" = curl ]; then
        # The key goes in through a config on stdin, not argv, so ps does not show it.
        printf 'header = "X-API-Key: %s"\n' "$api_key" |
            curl --config - --silent --show-error --fail --max-time "$DRAIN_HTTP_TIMEOUT_S" "$DRAIN_URL" 2>&1
    else
        wget -q -O - -T "$DRAIN_HTTP_TIMEOUT_S" --header "X-API-Key: $api_key" "$DRAIN_URL" 2>&1 ||
            {
                rc=$?
                echo "wget exit $rc (4: network failure, 8: HTTP error status)"
                return "$rc"
            }
    fi
}

# The number of sandboxes in a JSON array of sandbox objects; fails on anything else.
# Emptiness is exact ("[]"); for a non-empty array the count comes from the sandboxID keys
# and is at least 1, which is all the drain decision needs.
count_sandboxes() {
    compact=$(printf '%s' "$1" | tr -d ' \t\r\n')
    case "$compact" in
        '[]') echo 0 ;;
        '['*']')
            n=$(printf '%s' "$1" | grep -o '"sandboxID"' | wc -l | tr -d ' ')
            if is_uint "$n" && [ "$n" -gt 0 ]; then echo "$n"; else echo 1; fi
            ;;
        *) return 1 ;;
    esac
}

start=$(date +%s)
deadline=$((start + DRAIN_DEADLINE_S))
polls=0
say "draining: waiting for running sandboxes to reach 0 (deadline ${DRAIN_DEADLINE_S}s, $DRAIN_HTTP $DRAIN_URL)"

while :; do
    now=$(date +%s)
    if [ "$now" -ge "$deadline" ]; then
        say "drain deadline of ${DRAIN_DEADLINE_S}s reached after $polls poll(s); leaving remaining sandboxes to the server's graceful shutdown"
        exit 0
    fi
    polls=$((polls + 1))
    left=$((deadline - now))
    if body=$(fetch); then
        if count=$(count_sandboxes "$body"); then
            if [ "$count" -eq 0 ]; then
                say "drained: no running sandboxes after $((now - start))s and $polls poll(s)"
                exit 0
            fi
            say "poll $polls: $count running sandbox(es); ${left}s left"
        else
            say "poll $polls: unexpected response (not a JSON array): $(printf '%s' "$body" | tr '\n' ' ' | cut -c 1-200); retrying, ${left}s left"
        fi
    else
        say "poll $polls: sandbox API unreachable or failing: $(printf '%s' "$body" | tail -n 1); retrying, ${left}s left"
    fi
    sleep "$DRAIN_POLL_S"
done
