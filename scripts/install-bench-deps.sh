#!/usr/bin/env bash
# The C baselines of `rdmakit bench`, from Debian's archive: iperf3 (a TCP
# stream), sockperf (a UDP ping-pong) and libfabric-bin (fi_pingpong, the
# libfabric ping-pong, run with its tcp provider). Without them the bench
# prints one line per missing tool and shows no C baseline in those rows.
# Debian/Ubuntu; needs root. matplotlib for `--plot` is the Python extra
# `rdmakit[plot]`.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    echo "usage: $0    install iperf3, sockperf and libfabric-bin (apt)"
    exit 0
fi
if command -v iperf3 >/dev/null && command -v sockperf >/dev/null && command -v fi_pingpong >/dev/null; then
    echo "iperf3, sockperf and fi_pingpong are installed"
    exit 0
fi
# iperf3's package asks whether to start a daemon: no.
echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections 2>/dev/null || true
# shellcheck source=SCRIPTDIR/lib/apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
apt_install iperf3 sockperf libfabric-bin >/dev/null
echo "installed: $(iperf3 --version 2>&1 | head -1); sockperf $(sockperf --version 2>&1 | grep -o 'version [^ ]*' | head -1); $(command -v fi_pingpong)"
