#!/usr/bin/env bash
# In the lab guest: perftest's own TEST on kernel rxe (server and client on rxe0,
# scripts/lab/perftest-pair.sh) next to "rdmakit perftest TEST" on the soft engine
# (server and client in a network namespace of their own, on 127.0.0.2 and
# 127.0.0.3: rxe holds UDP 4791 in the guest's namespace), with the same ARGs;
# prints both client results and the soft engine's bandwidth as a fraction of rxe's.
# Run it through the lab:
#   scripts/lab-run.sh -- scripts/lab/perftest-ratio.sh ib_write_bw -D 10
set -euo pipefail

PROG="${0##*/}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NETNS="${RDMAKIT_RATIO_NETNS:-rdmakit-ratio}"
PORT="${PERFTEST_PORT:-18515}"
WAIT_S="${PERFTEST_WAIT_S:-60}"

usage() {
    cat <<USAGE
Usage: $PROG [-h] TEST [ARG...]

Run TEST (a perftest bandwidth program: ib_write_bw, ib_read_bw, ib_send_bw) with
ARG... twice in this guest: perftest on rxe0, then rdmakit's on its soft engine
in the network namespace $NETNS. Prints both outputs, then a line
  RATIO TEST ARG... soft=<MB/s> rxe=<MB/s> ratio=<soft/rxe>
(BW average of the clients). Needs root (ip netns) and the lab's rxe0.
Environment: PERFTEST_PORT, PERFTEST_WAIT_S, RDMAKIT_RATIO_NETNS.
USAGE
}

case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    "") usage >&2; exit 2 ;;
esac
TEST="$1"
shift

tmp="$(mktemp -d)"
server_pid=
cleanup() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
    fi
    ip netns del "$NETNS" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

# The client's BW average (MB/sec): the 4th column of perftest's result row.
bw_average() {
    awk '$1 ~ /^[0-9]+$/ && NF >= 5 && $2 ~ /^[0-9]+$/ { bw = $4 } END { if (bw == "") exit 1; print bw }' "$1"
}

echo "=== perftest $TEST $* on rxe0"
PERFTEST_PORT="$PORT" "$HERE/perftest-pair.sh" "$TEST" "$@" | tee "$tmp/rxe"
sed -n '/^=== client/,$p' "$tmp/rxe" >"$tmp/rxe.client"

ip netns del "$NETNS" 2>/dev/null || true
ip netns add "$NETNS"
ip -n "$NETNS" link set lo up
in_ns=(ip netns exec "$NETNS" env -u PYTHONPYCACHEPREFIX python3 -m rdmakit perftest "$TEST" -p "$PORT")
server_cpu=() client_cpu=()
if command -v taskset >/dev/null 2>&1 && (($(nproc) >= 2)); then
    server_cpu=(taskset -c 0)
    client_cpu=(taskset -c 1)
fi
"${server_cpu[@]}" "${in_ns[@]}" -d 127.0.0.2 "$@" >"$tmp/soft.server" 2>&1 &
server_pid=$!
for ((i = 0; i < WAIT_S * 10; i++)); do
    ip netns exec "$NETNS" ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q . && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
done
client_rc=0
"${client_cpu[@]}" "${in_ns[@]}" -d 127.0.0.3 "$@" 127.0.0.2 >"$tmp/soft.client" 2>&1 || client_rc=$?
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=
echo "=== rdmakit perftest $TEST $* on the soft engine (netns $NETNS, 127.0.0.3 -> 127.0.0.2)"
cat "$tmp/soft.server" "$tmp/soft.client"
if ((client_rc != 0 || server_rc != 0)); then
    echo "$PROG: error: rdmakit perftest $TEST failed (client $client_rc, server $server_rc)" >&2
    exit 1
fi

rxe="$(bw_average "$tmp/rxe.client")" || { echo "$PROG: error: no result from perftest" >&2; exit 1; }
soft="$(bw_average "$tmp/soft.client")" || { echo "$PROG: error: no result from rdmakit" >&2; exit 1; }
ratio="$(awk -v s="$soft" -v r="$rxe" 'BEGIN { printf "%.2f", (r > 0 ? s / r : 0) }')"
echo "RATIO $TEST $* soft=$soft rxe=$rxe ratio=$ratio"
