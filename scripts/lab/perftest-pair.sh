#!/usr/bin/env bash
# Run a perftest benchmark between two processes on one RDMA device (the
# server and the client both on rxe0: loopback over its RoCEv2 GID).
# Meant for the lab guest: scripts/lab-run.sh -- scripts/lab/perftest-pair.sh ib_write_bw -s 65536 -n 2000
set -euo pipefail

PROG="${0##*/}"
DEV="${RDMAKIT_RXE_DEV:-rxe0}"
GID_INDEX="${RDMAKIT_LAB_GID_INDEX:-1}"
ADDR="${RDMAKIT_LAB_GUEST_ADDR:-127.0.0.1}"
PORT="${PERFTEST_PORT:-18515}"
WAIT_S="${PERFTEST_WAIT_S:-60}"

usage() {
    cat <<USAGE
Usage: $PROG [-h] TEST [ARG...]

Start "TEST -d $DEV -x $GID_INDEX -p $PORT ARG..." as the server, then the same
as the client connecting to $ADDR, and print the server's then the client's
output. TEST is a perftest program (ib_write_bw, ib_send_lat, ib_read_bw, ...).
Exits non-zero if either side fails.
Environment: RDMAKIT_RXE_DEV, RDMAKIT_LAB_GID_INDEX, RDMAKIT_LAB_GUEST_ADDR,
PERFTEST_PORT, PERFTEST_WAIT_S (seconds to wait for the server's port).
USAGE
}

case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    "") usage >&2; exit 2 ;;
esac
TEST="$1"
shift
command -v "$TEST" >/dev/null 2>&1 || { echo "$PROG: error: $TEST not found (perftest)" >&2; exit 1; }

tmp="$(mktemp -d)"
server_pid=
cleanup() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

common=(-d "$DEV" -x "$GID_INDEX" -p "$PORT" "$@")
# Both sides busy-poll their CQ: on two CPUs each gets its own, otherwise they
# take turns and the latency figures measure the scheduler.
server_cpu=() client_cpu=()
if command -v taskset >/dev/null 2>&1 && (($(nproc) >= 2)); then
    server_cpu=(taskset -c 0)
    client_cpu=(taskset -c 1)
fi
"${server_cpu[@]}" "$TEST" "${common[@]}" >"$tmp/server" 2>&1 &
server_pid=$!

listening() {
    ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q .
}
for ((i = 0; i < WAIT_S * 10; i++)); do
    listening && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
done
if ! listening; then
    cat "$tmp/server" >&2
    echo "$PROG: error: $TEST server did not listen on port $PORT" >&2
    exit 1
fi

client_rc=0
"${client_cpu[@]}" "$TEST" "${common[@]}" "$ADDR" >"$tmp/client" 2>&1 || client_rc=$?
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=

echo "=== server: $TEST ${common[*]}"
cat "$tmp/server"
echo "=== client: $TEST ${common[*]} $ADDR"
cat "$tmp/client"
if ((client_rc != 0 || server_rc != 0)); then
    echo "$PROG: error: $TEST failed (client $client_rc, server $server_rc)" >&2
    exit 1
fi
