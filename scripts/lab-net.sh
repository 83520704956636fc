#!/usr/bin/env bash
# The lab's private network: two network namespaces joined by a veth pair.
#
#   netns $LAB_NETNS (rdmakit-lab)           netns $HOST_NETNS (rdmakit-host)
#   +-----------------------------------+    +-----------------------------+
#   | qemu -- tap lab0tap --+           |    |                             |
#   |                      bridge lab0  |    |                             |
#   |          veth lab0v --+ ==========|====|== veth lab0h  10.77.0.1/24  |
#   +-----------------------------------+    +-----------------------------+
#   guest ens3 (virtio-net on lab0tap): 10.77.0.2/24
#
# Nothing is added to the root namespace: host-side programs reach the guest
# with `ip netns exec rdmakit-host PROGRAM`. Plain L2, no NAT: IP headers
# reach the guest unchanged, which RoCEv2's ICRC needs.
set -euo pipefail

# shellcheck source=scripts/lab/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab/common.sh"

usage() {
    cat <<USAGE
Usage: $PROG [-h] up|down|status

  up      create netns $LAB_NETNS (bridge $LAB_BRIDGE, tap $LAB_TAP, veth $LAB_VETH_LAB)
          and netns $HOST_NETNS (veth $LAB_VETH_HOST = $HOST_ADDR/$LAB_SUBNET_PREFIX);
          idempotent
  down    delete both namespaces (and so every interface in them)
  status  show the namespaces, links and addresses; ping the guest
          ($GUEST_ADDR) from $HOST_NETNS if a guest runs; exit 1 if down

Run host-side programs against the guest with:
  ip netns exec $HOST_NETNS PROGRAM ...

Environment: RDMAKIT_LAB_INSTANCE (namespaces get a -INSTANCE suffix when it
is not "default"), RDMAKIT_LAB_NETNS, RDMAKIT_HOST_NETNS,
RDMAKIT_LAB_HOST_ADDR, RDMAKIT_LAB_GUEST_ADDR.
USAGE
}

netns_exists() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qxF "$1"
}

net_is_up() {
    netns_exists "$LAB_NETNS" && netns_exists "$HOST_NETNS" &&
        ip -n "$LAB_NETNS" link show "$LAB_TAP" >/dev/null 2>&1 &&
        ip -n "$LAB_NETNS" link show "$LAB_BRIDGE" >/dev/null 2>&1 &&
        ip -n "$HOST_NETNS" link show "$LAB_VETH_HOST" >/dev/null 2>&1
}

guest_running() {
    local pid
    pid="$(cat "$LAB_RUN_DIR/qemu.pid" 2>/dev/null)" || return 1
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

quiet_ns() {
    # No IPv6 autoconfiguration chatter on the lab links: captures show only
    # what the tests send.
    ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
        net.ipv6.conf.default.disable_ipv6=1 >/dev/null
}

cmd_up() {
    if net_is_up; then
        info "lab network is up ($LAB_NETNS, $HOST_NETNS)"
        return 0
    fi
    if netns_exists "$LAB_NETNS" || netns_exists "$HOST_NETNS"; then
        info "removing a partial lab network first"
        cmd_down
    fi
    [[ -c /dev/net/tun ]] || die "/dev/net/tun missing (modprobe tun)"
    ip netns add "$LAB_NETNS"
    ip netns add "$HOST_NETNS"
    quiet_ns "$LAB_NETNS"
    quiet_ns "$HOST_NETNS"
    ip -n "$LAB_NETNS" link set lo up
    ip -n "$HOST_NETNS" link set lo up
    ip -n "$LAB_NETNS" link add "$LAB_BRIDGE" type bridge stp_state 0 forward_delay 0
    ip -n "$LAB_NETNS" tuntap add dev "$LAB_TAP" mode tap
    # Both ends are created inside the lab namespace and one is moved: neither
    # ever appears in the root namespace.
    ip -n "$LAB_NETNS" link add "$LAB_VETH_LAB" type veth peer name "$LAB_VETH_HOST"
    ip -n "$LAB_NETNS" link set "$LAB_VETH_HOST" netns "$HOST_NETNS"
    ip -n "$LAB_NETNS" link set "$LAB_TAP" master "$LAB_BRIDGE"
    ip -n "$LAB_NETNS" link set "$LAB_VETH_LAB" master "$LAB_BRIDGE"
    ip -n "$LAB_NETNS" link set "$LAB_BRIDGE" up
    ip -n "$LAB_NETNS" link set "$LAB_TAP" up
    ip -n "$LAB_NETNS" link set "$LAB_VETH_LAB" up
    ip -n "$HOST_NETNS" addr add "$HOST_ADDR/$LAB_SUBNET_PREFIX" dev "$LAB_VETH_HOST"
    ip -n "$HOST_NETNS" link set "$LAB_VETH_HOST" up
    info "lab network up: $HOST_NETNS:$LAB_VETH_HOST=$HOST_ADDR, guest $GUEST_ADDR behind $LAB_NETNS:$LAB_TAP"
}

cmd_down() {
    if guest_running; then
        warn "a lab guest still runs (pid $(cat "$LAB_RUN_DIR/qemu.pid")); stop it with scripts/lab-run.sh stop"
    fi
    local ns
    for ns in "$HOST_NETNS" "$LAB_NETNS"; do
        if netns_exists "$ns"; then
            ip netns del "$ns"
        fi
    done
    info "lab network down"
}

cmd_status() {
    local rc=0 ns
    for ns in "$LAB_NETNS" "$HOST_NETNS"; do
        if netns_exists "$ns"; then
            echo "== netns $ns"
            ip -n "$ns" -br link
            ip -n "$ns" -br addr | awk '$3 != ""'
        else
            echo "== netns $ns: absent"
            rc=1
        fi
    done
    if ((rc == 0)) && ! net_is_up; then
        echo "lab network is incomplete; run '$PROG up' (it rebuilds it)"
        rc=1
    fi
    if ((rc == 0)) && guest_running; then
        echo "== guest (qemu pid $(cat "$LAB_RUN_DIR/qemu.pid"))"
        ip netns exec "$HOST_NETNS" ping -c 1 -W 2 "$GUEST_ADDR" || rc=1
    fi
    return "$rc"
}

case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    up | down)
        (($# == 1)) || { usage >&2; exit 2; }
        need_root "network namespaces"
        need_cmd ip
        "cmd_$1" ;;
    status)
        (($# == 1)) || { usage >&2; exit 2; }
        need_cmd ip
        cmd_status ;;
    *) usage >&2; exit 2 ;;
esac
