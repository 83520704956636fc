#!/usr/bin/env bash
# Create, check or remove a kernel soft-RoCE (rdma_rxe) device over a netdev.
# For a Linux host (or the lab guest) whose kernel has CONFIG_RDMA_RXE.
set -euo pipefail

PROG="${0##*/}"
RXE_NAME="${RXE_NAME:-rxe0}"
WAIT_S="${RXE_WAIT_S:-20}"

usage() {
    cat <<USAGE
Usage: $PROG [-h] [-n NAME] up IFACE
       $PROG [-h] [-n NAME] check
       $PROG [-h] [-n NAME] down

Manage the kernel soft-RoCE device NAME (default rxe0, or \$RXE_NAME).

  up IFACE  modprobe rdma_rxe; rdma link add NAME type rxe netdev IFACE;
            wait until port 1 is ACTIVE. Succeeds if NAME already runs over IFACE.
  check     show the device: rdma link, port state, GID table, ibv_devices.
            Exits 1 if NAME does not exist or its port is not ACTIVE.
  down      rdma link delete NAME (no error if it does not exist).

Needs root for up/down, and iproute2's rdma(8). The device sits on IFACE's
addresses: give IFACE its IPv4 address before "up" so the IPv4-mapped RoCEv2
GID exists. If this kernel has no rdma_rxe, use the lab VM instead:
scripts/lab-build-vm.sh, then scripts/lab-run.sh.
USAGE
}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

info() {
    printf '%s: %s\n' "$PROG" "$*" >&2
}

need_rdma_tool() {
    command -v rdma >/dev/null 2>&1 ||
        die "rdma(8) not found: install iproute2 (Debian: apt-get install iproute2)"
}

need_root() {
    [[ "$(id -u)" -eq 0 ]] || die "'$1' needs root"
}

sysfs_dev() {
    printf '/sys/class/infiniband/%s\n' "$RXE_NAME"
}

port_state() {
    # "4: ACTIVE" -> ACTIVE
    local f
    f="$(sysfs_dev)/ports/1/state"
    [[ -r "$f" ]] || return 1
    sed 's/^[0-9]*: *//' "$f"
}

load_module() {
    if [[ -d /sys/module/rdma_rxe ]]; then
        return 0
    fi
    if ! modprobe rdma_rxe 2>/dev/null; then
        local why="modprobe rdma_rxe failed"
        if ! modinfo rdma_rxe >/dev/null 2>&1; then
            why="kernel $(uname -r) has no rdma_rxe module (CONFIG_RDMA_RXE is not set, or its modules package is missing)"
        fi
        die "$why; use the lab VM instead: scripts/lab-build-vm.sh && scripts/lab-run.sh -- ibv_devinfo"
    fi
}

# The netdev an rxe device is bound to, from "rdma link show NAME/1".
bound_netdev() {
    rdma link show "$RXE_NAME/1" 2>/dev/null | sed -n 's/.* netdev \([^ ]*\).*/\1/p'
}

cmd_up() {
    local iface="$1"
    need_root up
    need_rdma_tool
    [[ -e "/sys/class/net/$iface" ]] || die "no network interface '$iface'"
    load_module
    if [[ -e "$(sysfs_dev)" ]]; then
        local cur
        cur="$(bound_netdev)"
        [[ "$cur" == "$iface" ]] ||
            die "$RXE_NAME already exists over '${cur:-?}', not '$iface'; run '$PROG down' first"
        info "$RXE_NAME already exists over $iface"
    else
        rdma link add "$RXE_NAME" type rxe netdev "$iface" ||
            die "rdma link add $RXE_NAME type rxe netdev $iface failed (see dmesg)"
    fi
    ip link set "$iface" up
    local i state=""
    for ((i = 0; i < WAIT_S * 10; i++)); do
        state="$(port_state || true)"
        [[ "$state" == ACTIVE ]] && break
        sleep 0.1
    done
    [[ "$state" == ACTIVE ]] ||
        die "$RXE_NAME port 1 is '${state:-absent}', not ACTIVE after ${WAIT_S} s (is $iface up with a carrier?)"
    if ! ip -4 -o addr show dev "$iface" | grep -q inet; then
        info "warning: $iface has no IPv4 address, so $RXE_NAME has no IPv4-mapped GID"
    fi
    info "$RXE_NAME over $iface: port 1 ACTIVE"
}

cmd_check() {
    need_rdma_tool
    [[ -e "$(sysfs_dev)" ]] || die "no RDMA device '$RXE_NAME' (rdma link: $(rdma link show 2>/dev/null | tr '\n' ' '))"
    echo "== rdma link show $RXE_NAME/1"
    rdma link show "$RXE_NAME/1"
    echo "== GID table (index type gid netdev)"
    # The table has hundreds of mostly empty slots: read them with builtins
    # (a fork per slot takes a minute in an emulated guest).
    local port g idx gid type ndev
    port="$(sysfs_dev)/ports/1"
    for g in "$port"/gids/*; do
        idx="${g##*/}"
        gid=""
        { IFS= read -r gid <"$g"; } 2>/dev/null || true
        [[ -n "$gid" && "$gid" != 0000:0000:0000:0000:0000:0000:0000:0000 ]] || continue
        type="?" ndev="?"
        { IFS= read -r type <"$port/gid_attrs/types/$idx"; } 2>/dev/null || true
        { IFS= read -r ndev <"$port/gid_attrs/ndevs/$idx"; } 2>/dev/null || true
        printf '%s\t%s\t%s\t%s\n' "$idx" "$type" "$gid" "$ndev"
    done
    if command -v ibv_devices >/dev/null 2>&1; then
        echo "== ibv_devices"
        ibv_devices
    else
        info "ibv_devices not found (scripts/install-verbs-deps.sh installs ibverbs-utils)"
    fi
    local state
    state="$(port_state || true)"
    [[ "$state" == ACTIVE ]] || die "$RXE_NAME port 1 is '${state:-absent}', not ACTIVE"
}

cmd_down() {
    need_root down
    need_rdma_tool
    if [[ ! -e "$(sysfs_dev)" ]]; then
        info "no device $RXE_NAME; nothing to do"
        return 0
    fi
    rdma link delete "$RXE_NAME" || die "rdma link delete $RXE_NAME failed"
    info "$RXE_NAME deleted"
}

while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        -n | --name)
            (($# >= 2)) || die "$1 needs a value"
            RXE_NAME="$2"; shift 2 ;;
        *) break ;;
    esac
done

case "${1:-}" in
    up)
        (($# == 2)) || { usage >&2; exit 2; }
        cmd_up "$2" ;;
    check)
        (($# == 1)) || { usage >&2; exit 2; }
        cmd_check ;;
    down)
        (($# == 1)) || { usage >&2; exit 2; }
        cmd_down ;;
    *)
        usage >&2; exit 2 ;;
esac
