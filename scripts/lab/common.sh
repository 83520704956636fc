# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables are for the scripts that source this
# Shared definitions for the soft-RoCE lab scripts. Sourced, never executed.
#
# Layout of the lab cache ($LAB_DIR, default build/lab in the checkout):
#   rootfs/        Debian bookworm tree made by mmdebstrap
#   site/          wheels for the guest's Python 3.11 (pip --target)
#   rootfs.ext4    the guest's root disk (booted with -snapshot: never modified)
#   vmlinuz, initrd.img
#   *.stamp        hash of the inputs each stage was built from
#   run/INSTANCE/  state of one running guest; share/ is its writable 9p folder

LAB_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_ROOT="$(cd "$LAB_SCRIPTS/.." && pwd)"
LAB_DIR="${RDMAKIT_LAB_DIR:-$REPO_ROOT/build/lab}"
LAB_INSTANCE="${RDMAKIT_LAB_INSTANCE:-default}"

# Network picture (see docs/lab.md): everything lives in namespaces made here.
#   $LAB_NETNS:  bridge lab0 <- tap lab0tap (qemu's NIC) + veth lab0v
#   $HOST_NETNS: veth lab0h = $HOST_ADDR, peer of lab0v
# The root namespace gets neither an interface nor an address.
if [[ "$LAB_INSTANCE" == default ]]; then
    LAB_NETNS="${RDMAKIT_LAB_NETNS:-rdmakit-lab}"
    HOST_NETNS="${RDMAKIT_HOST_NETNS:-rdmakit-host}"
else
    LAB_NETNS="${RDMAKIT_LAB_NETNS:-rdmakit-lab-$LAB_INSTANCE}"
    HOST_NETNS="${RDMAKIT_HOST_NETNS:-rdmakit-host-$LAB_INSTANCE}"
fi
LAB_SUBNET_PREFIX=24
HOST_ADDR="${RDMAKIT_LAB_HOST_ADDR:-10.77.0.1}"
GUEST_ADDR="${RDMAKIT_LAB_GUEST_ADDR:-10.77.0.2}"
LAB_BRIDGE=lab0
LAB_TAP=lab0tap
LAB_VETH_LAB=lab0v
LAB_VETH_HOST=lab0h
# Locally administered MAC so the guest's NIC name and address are stable.
GUEST_MAC="${RDMAKIT_LAB_GUEST_MAC:-52:54:00:77:00:02}"

LAB_SUITE=bookworm
LAB_RUN_DIR="$LAB_DIR/run/$LAB_INSTANCE"

PROG="$(basename "$0")"

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

warn() {
    printf '%s: warning: %s\n' "$PROG" "$*" >&2
}

info() {
    printf '%s: %s\n' "$PROG" "$*" >&2
}

need_root() {
    [[ "$(id -u)" -eq 0 ]] || die "must run as root ($1)"
}

need_cmd() {
    local cmd
    for cmd in "$@"; do
        command -v "$cmd" >/dev/null 2>&1 ||
            die "'$cmd' not found; run scripts/install-lab-deps.sh"
    done
}

# Seconds since the epoch with a fractional part, for timings in logs.
now() {
    date +%s.%N
}

elapsed() {
    awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'
}
