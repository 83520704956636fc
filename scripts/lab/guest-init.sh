#!/bin/bash
# Runs inside the lab guest as PID 1 (exec'd by /sbin/rdmakit-lab-init from
# the read-only checkout). Brings up the NIC and rxe0, reports readiness, runs
# the jobs the host drops into /mnt/labrun/jobs, then powers off.
#
# Contract with scripts/lab-run.sh (all files in the labrun share):
#   config               written by the host before boot (sourced here)
#   ready                written once rxe0's port is ACTIVE (key=value lines)
#   setup-failed         written instead of ready, with the reason
#   jobs/ID.cmd          a bash script to run; cwd = checkout
#   jobs/ID.timeout      seconds (optional)
#   jobs/ID.out/.err     the job's stdout/stderr, written as it runs
#   jobs/ID.status       its exit status, written when it ends
#   jobs/ID.kill         host asks to kill the job's session
#   poweroff             host asks to power off (MODE=keep)
# MODE=oneshot powers off after job 0 ends.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN=/mnt/labrun
JOBS=$RUN/jobs
CHECKOUT=/mnt/rdmakit
SITE=/opt/rdmakit/site

log() {
    local msg
    msg="lab-guest [$(cut -d' ' -f1 /proc/uptime)s]: $*"
    printf '%s\n' "$msg" >/dev/console 2>/dev/null
    printf '%s\n' "$msg" >>"$RUN/guest.log"
}

power_off() {
    log "powering off"
    dmesg >"$RUN/dmesg.txt" 2>/dev/null
    sync
    umount "$RUN" 2>/dev/null
    echo o >/proc/sysrq-trigger
    sleep 60
}

fail() {
    log "setup failed: $*"
    printf '%s\n' "$*" >"$RUN/setup-failed"
    power_off
}

# --- base system -----------------------------------------------------------
mountpoint -q /run || mount -t tmpfs -o mode=0755 tmpfs /run
mountpoint -q /tmp || mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /dev/pts /dev/shm
mountpoint -q /dev/pts || mount -t devpts devpts /dev/pts
mountpoint -q /dev/shm || mount -t tmpfs tmpfs /dev/shm
hostname rdmakit-lab
ip link set lo up
log "kernel $(uname -r) up; setting up the network"

[[ -r "$RUN/config" ]] || fail "no $RUN/config"
MODE=oneshot GUEST_ADDR='' PREFIX=24 GUEST_MAC='' HOST_ADDR='' RXE_NAME=rxe0
# shellcheck source=/dev/null
source "$RUN/config"
[[ -n "$GUEST_ADDR" && -n "$GUEST_MAC" ]] || fail "config lacks GUEST_ADDR/GUEST_MAC"

# --- NIC and rxe -----------------------------------------------------------
modprobe virtio_net || fail "modprobe virtio_net failed"
NIC=
for _ in $(seq 50); do
    for d in /sys/class/net/*; do
        if [[ "$(cat "$d/address" 2>/dev/null)" == "$GUEST_MAC" ]]; then
            NIC="${d##*/}"
        fi
    done
    [[ -n "$NIC" ]] && break
    sleep 0.1
done
[[ -n "$NIC" ]] || fail "no NIC with MAC $GUEST_MAC"
ip addr add "$GUEST_ADDR/$PREFIX" dev "$NIC" || fail "cannot address $NIC"
ip link set "$NIC" up || fail "cannot bring $NIC up"

bash "$CHECKOUT/scripts/rxe-setup.sh" -n "$RXE_NAME" up "$NIC" >>"$RUN/guest.log" 2>&1 ||
    fail "rxe-setup.sh up $NIC failed: $(tail -n 3 "$RUN/guest.log" | tr '\n' ' ')"

# The RoCEv2 GID that carries the IPv4 address (::ffff:a.b.c.d); gid 0 is the
# IPv6 link-local one.
GID_INDEX='' GID=''
ports=/sys/class/infiniband/$RXE_NAME/ports/1
for _ in $(seq 50); do
    for g in "$ports"/gids/*; do
        i="${g##*/}"
        gid="" type=""
        { IFS= read -r gid <"$g"; } 2>/dev/null || continue
        [[ "$gid" == 0000:0000:0000:0000:0000:ffff:* ]] || continue
        { IFS= read -r type <"$ports/gid_attrs/types/$i"; } 2>/dev/null || continue
        if [[ "$type" == "RoCE v2" ]]; then
            GID_INDEX=$i GID=$gid
            break 2
        fi
    done
    sleep 0.1
done
[[ -n "$GID_INDEX" ]] || fail "$RXE_NAME has no IPv4-mapped RoCE v2 GID"

export HOME=/root LANG=C.UTF-8 TERM=dumb
export PATH="$SITE/bin:$PATH"
export PYTHONPATH="$CHECKOUT:$SITE:/usr/lib/python3/dist-packages"
# The checkout is read-only: caches go to /tmp.
export PYTHONPYCACHEPREFIX=/tmp/pycache
export PYTEST_ADDOPTS="-p no:cacheprovider${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
export HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hypothesis
export RDMAKIT_LAB_GUEST=1 RDMAKIT_LAB_OUT="$RUN/out"
export RDMAKIT_RXE_DEV="$RXE_NAME" RDMAKIT_LAB_NIC="$NIC"
export RDMAKIT_LAB_GID_INDEX="$GID_INDEX" RDMAKIT_LAB_GID="$GID"
export RDMAKIT_LAB_GUEST_ADDR="$GUEST_ADDR" RDMAKIT_LAB_HOST_ADDR="$HOST_ADDR"
mkdir -p "$RUN/out" "$JOBS"

{
    printf 'KERNEL=%s\nNIC=%s\nRXE=%s\nGID_INDEX=%s\nGID=%s\nUPTIME=%s\n' \
        "$(uname -r)" "$NIC" "$RXE_NAME" "$GID_INDEX" "$GID" "$(cut -d' ' -f1 /proc/uptime)"
} >"$RUN/ready.tmp" && mv "$RUN/ready.tmp" "$RUN/ready"
log "ready: $RXE_NAME over $NIC ($GUEST_ADDR), gid index $GID_INDEX; mode $MODE"

# --- job loop --------------------------------------------------------------
declare -A SID=()

# A 0.2 s pause without forking sleep(1): a read that times out on a FIFO
# nobody writes to. The loop runs for the guest's whole life; under TCG every
# fork costs milliseconds of both cores.
mkfifo /run/lab-nap
exec 7<>/run/lab-nap
nap() {
    read -r -t 0.2 -u 7 _ || true
}

start_job() {
    local id="$1"
    setsid bash "$CHECKOUT/scripts/lab/guest-job.sh" "$id" &
    SID[$id]=$!
    log "job $id started (session ${SID[$id]})"
}

kill_job() {
    local id="$1" sid="${SID[$1]:-}"
    rm -f "$JOBS/$id.kill"
    [[ -n "$sid" ]] || return 0
    log "job $id: killing session $sid"
    pkill -TERM -s "$sid" 2>/dev/null
    sleep 2
    pkill -KILL -s "$sid" 2>/dev/null
    [[ -e "$JOBS/$id.status" ]] || { echo 143 >"$JOBS/$id.status.tmp" && mv "$JOBS/$id.status.tmp" "$JOBS/$id.status"; }
}

while :; do
    for f in "$JOBS"/*.cmd; do
        [[ -e "$f" ]] || continue
        id="${f##*/}"
        id="${id%.cmd}"
        [[ -n "${SID[$id]+x}" || -e "$JOBS/$id.status" ]] && continue
        start_job "$id"
    done
    for f in "$JOBS"/*.kill; do
        [[ -e "$f" ]] || continue
        id="${f##*/}"
        kill_job "${id%.kill}"
    done
    if [[ "$MODE" == oneshot && -e "$JOBS/0.status" ]]; then
        break
    fi
    [[ -e "$RUN/poweroff" ]] && break
    nap
done
power_off
