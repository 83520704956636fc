#!/usr/bin/env bash
# Install the host packages the soft-RoCE lab needs (Debian/Ubuntu, apt).
set -euo pipefail

PACKAGES=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs iproute2 iputils-ping tcpdump)

usage() {
    cat <<USAGE
Usage: ${0##*/} [-h]

Install the host packages for the soft-RoCE lab VM with apt:
  ${PACKAGES[*]}
(--no-install-recommends, after apt-get update). Needs root, or sudo.
Then build the guest image with scripts/lab-build-vm.sh.
USAGE
}

case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    "") ;;
    *) usage >&2; exit 2 ;;
esac

# shellcheck source=SCRIPTDIR/lib/apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
apt_install "${PACKAGES[@]}"
