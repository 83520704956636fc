#!/usr/bin/env bash
# Packet capture and dissection tools for rdmakit's capture tests and
# `rdmakit capture`: tcpdump and tshark (Wireshark's InfiniBand dissector
# decodes RoCEv2 on UDP 4791 by default). Debian/Ubuntu; needs root.
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    echo "usage: $0    install tcpdump and tshark (apt)"
    exit 0
fi
if command -v tcpdump >/dev/null && command -v tshark >/dev/null; then
    echo "tcpdump and tshark are installed"
    exit 0
fi
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
# shellcheck source=SCRIPTDIR/lib/apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
apt_install tcpdump tshark >/dev/null
echo "installed: $(tcpdump --version 2>&1 | head -1); $(tshark --version 2>/dev/null | head -1)"
