#!/usr/bin/env bash
# Boot the lab guest and run the netem matrix in it (rdmakit.testing.netem): WRITE and
# READ goodput of rdmakit, of kernel rxe and of iperf3 TCP, and every RC operation with
# its bytes checked, on veth paths under netem delay, loss, ECN marks, RED, reordering,
# duplication, corruption and a rate limit. Prints the table; ARGs go to the module:
#   scripts/lab/netem-matrix.sh [--paths clean,loss1] [--runs iperf3,rk-rk] [--json-out FILE]
# A --json-out FILE is written in the guest's writable share (RDMAKIT_LAB_OUT) and
# copied to FILE on the host.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
args=() json=
while (($#)); do
    case "$1" in
        -h | --help)
            sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        --json-out)
            [[ $# -ge 2 ]] || { echo "${0##*/}: error: --json-out needs a file" >&2; exit 2; }
            json="$2"
            shift 2
            ;;
        *) args+=("$1"); shift ;;
    esac
done
name="netem-$$.json"
status=0
# shellcheck disable=SC2016  # expanded in the guest
"$HERE/../lab-run.sh" --timeout "${RDMAKIT_LAB_TIMEOUT:-7200}" -- bash -c \
    'exec bash scripts/lab/guest-python -m rdmakit.testing.netem --json-out "$RDMAKIT_LAB_OUT/$0" "$@"' \
    "$name" "${args[@]}" || status=$?
out="${RDMAKIT_LAB_DIR:-$HERE/../../build/lab}/run/${RDMAKIT_LAB_INSTANCE:-default}/share/out/$name"
if [[ -n "$json" && -f "$out" ]]; then
    cp "$out" "$json"
fi
exit "$status"
