#!/usr/bin/env bash
# Boot the soft-RoCE lab guest (qemu, TCG) and run commands in it, on a
# kernel rxe0 device. See docs/lab.md.
set -euo pipefail

# --instance must be known before common.sh names the namespaces and folders.
_args=("$@")
for ((_i = 0; _i < ${#_args[@]}; _i++)); do
    case "${_args[_i]}" in
        --) break ;;
        --instance) export RDMAKIT_LAB_INSTANCE="${_args[_i + 1]:-}" ;;
    esac
done
unset _args _i

# shellcheck source=scripts/lab/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab/common.sh"

TIMEOUT_S="${RDMAKIT_LAB_TIMEOUT:-900}"
BOOT_TIMEOUT_S="${RDMAKIT_LAB_BOOT_TIMEOUT:-300}"
KEEP_TIMEOUT_S="${RDMAKIT_LAB_KEEP_TIMEOUT:-3600}"
SHARE="$LAB_RUN_DIR/share"
JOBS="$SHARE/jobs"
# Exit status for a failure of the lab itself (as `docker run` uses it).
LAB_FAILED=125

usage() {
    cat <<USAGE
Usage: $PROG [OPTIONS] [--] CMD [ARG...]
       $PROG start [OPTIONS] [-- CMD [ARG...]]
       $PROG exec [--bg] [--timeout S] [--] CMD [ARG...]
       $PROG wait|kill ID
       $PROG stop | status | console

Boot the lab guest (Debian bookworm kernel, TCG), create $RXE_DEFAULT over its
NIC ($GUEST_ADDR), run CMD in the guest and power off.

  (default)  boot, run CMD, power off; exit with CMD's status. The whole run
             (boot included) is limited to --timeout seconds (exit 124).
  start      boot in the background and return once $RXE_DEFAULT is ACTIVE; with
             CMD, also start CMD in the guest in the background (e.g. a
             responder). The guest stays up until "stop" (at most
             \$RDMAKIT_LAB_KEEP_TIMEOUT = $KEEP_TIMEOUT_S s).
  exec       run CMD in the running guest; exit with its status. With --bg,
             print the job ID and return at once ("wait ID" collects it).
  wait ID    stream job ID's output until it ends; exit with its status
  kill ID    kill job ID's process session in the guest
  stop       power the background guest off; remove the lab network if
             "start" created it
  status     show whether a guest runs, its rxe0 facts and its jobs
  console    print the guest's serial console log

CMD runs as root in bash, cwd = this checkout (shared read-only over 9p at
/mnt/rdmakit), with ulimit -l unlimited, PYTHONPATH = checkout + the lab's
wheels + /usr/lib/python3/dist-packages (Debian's pyverbs), and
  RDMAKIT_RXE_DEV  RDMAKIT_LAB_GID_INDEX  RDMAKIT_LAB_GID  RDMAKIT_LAB_NIC
  RDMAKIT_LAB_GUEST_ADDR  RDMAKIT_LAB_HOST_ADDR
  RDMAKIT_LAB_OUT  a writable folder; on the host: $SHARE/out
stdout and stderr are streamed back separately. Host-side programs reach the
guest from the namespace $HOST_NETNS ($HOST_ADDR):
  ip netns exec $HOST_NETNS PROGRAM

Options:
  --timeout S     limit for the run or the exec'd job (default
                  \$RDMAKIT_LAB_TIMEOUT or 900)
  --keep          same as "start"
  --bg            (exec) do not wait for the job
  -v, --verbose   copy the guest's serial console to stderr
  -q, --quiet     no progress messages
  --instance NAME run a separate guest with its own namespaces
                  (\$RDMAKIT_LAB_INSTANCE; default "default")

Exit status: CMD's, 124 on timeout, $LAB_FAILED if the lab itself failed.
Environment: RDMAKIT_LAB_DIR (image and run state, now $LAB_DIR),
RDMAKIT_LAB_TIMEOUT, RDMAKIT_LAB_BOOT_TIMEOUT ($BOOT_TIMEOUT_S),
RDMAKIT_LAB_KEEP_TIMEOUT.
USAGE
}
RXE_DEFAULT=rxe0

QUIET=0
VERBOSE=0
BG=0
OWN_QEMU=0
CONSOLE_TAIL_PID=

say() {
    ((QUIET)) || info "$@"
}

lab_fail() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit "$LAB_FAILED"
}

qemu_pid() {
    local pid
    pid="$(cat "$LAB_RUN_DIR/qemu.pid" 2>/dev/null)" || return 1
    [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == qemu-system-* ]] || return 1
    printf '%s\n' "$pid"
}

guest_running() {
    qemu_pid >/dev/null
}

check_image() {
    local f
    for f in rootfs.ext4 vmlinuz initrd.img; do
        [[ -f "$LAB_DIR/$f" ]] ||
            lab_fail "no $LAB_DIR/$f: build the image with scripts/lab-build-vm.sh"
    done
}

preflight() {
    need_root "network namespaces and a tap device"
    need_cmd qemu-system-x86_64 ip timeout flock setsid
    check_image
    [[ -c /dev/net/tun ]] || lab_fail "/dev/net/tun missing (modprobe tun)"
}

take_lock() {
    mkdir -p "$LAB_DIR/run"
    exec 9>"$LAB_DIR/run/$LAB_INSTANCE.lock"
    flock -n 9 || lab_fail "lab instance '$LAB_INSTANCE' is busy (another $PROG holds $LAB_DIR/run/$LAB_INSTANCE.lock)"
}

net_up() {
    if "$LAB_SCRIPTS/lab-net.sh" status >/dev/null 2>&1; then
        return 0
    fi
    "$LAB_SCRIPTS/lab-net.sh" up >/dev/null 2>&1 || "$LAB_SCRIPTS/lab-net.sh" up ||
        lab_fail "cannot create the lab network"
    touch "$LAB_RUN_DIR/net-owned"
}

net_down_if_owned() {
    if [[ -e "$LAB_RUN_DIR/net-owned" ]]; then
        "$LAB_SCRIPTS/lab-net.sh" down >/dev/null 2>&1 || warn "lab-net.sh down failed"
        rm -f "$LAB_RUN_DIR/net-owned"
    fi
}

kill_qemu() {
    local pid i
    pid="$(qemu_pid)" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

wait_qemu_exit() {
    # wait_qemu_exit SECONDS: true once qemu is gone
    local pid i
    pid="$(qemu_pid)" || return 0
    for ((i = 0; i < $1 * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

show_console_tail() {
    if [[ -s "$LAB_RUN_DIR/console.log" ]]; then
        printf '%s: last lines of the guest console (%s):\n' "$PROG" "$LAB_RUN_DIR/console.log" >&2
        tail -n 25 "$LAB_RUN_DIR/console.log" >&2
    fi
}

write_config() {
    local mode="$1"
    {
        printf 'MODE=%q\n' "$mode"
        printf 'GUEST_ADDR=%q\nPREFIX=%q\nGUEST_MAC=%q\n' "$GUEST_ADDR" "$LAB_SUBNET_PREFIX" "$GUEST_MAC"
        printf 'HOST_ADDR=%q\nRXE_NAME=%q\n' "$HOST_ADDR" "$RXE_DEFAULT"
    } >"$SHARE/config"
}

# boot MODE LIMIT_S: start qemu (in the lab namespace, under timeout) and wait
# until the guest reports rxe0 ready.
boot() {
    local mode="$1" limit="$2" t0
    t0="$(now)"
    rm -rf "$LAB_RUN_DIR"
    mkdir -p "$JOBS" "$SHARE/out"
    write_config "$mode"
    net_up
    local qemu=(
        qemu-system-x86_64 -name "rdmakit-lab-$LAB_INSTANCE"
        -accel tcg -cpu max -m 2048 -smp 2
        -nodefaults -no-user-config -display none -monitor none -no-reboot
        -serial "file:$LAB_RUN_DIR/console.log"
        -kernel "$LAB_DIR/vmlinuz" -initrd "$LAB_DIR/initrd.img"
        -append "console=ttyS0 root=/dev/vda rw init=/sbin/rdmakit-lab-init panic=-1 quiet"
        -drive "file=$LAB_DIR/rootfs.ext4,if=virtio,format=raw,snapshot=on"
        -netdev "tap,id=n0,ifname=$LAB_TAP,script=no,downscript=no"
        -device "virtio-net-pci,netdev=n0,mac=$GUEST_MAC,romfile=,speed=10000,duplex=full"
        -virtfs "local,path=$REPO_ROOT,mount_tag=rdmakit,security_model=none,readonly=on"
        -virtfs "local,path=$SHARE,mount_tag=labrun,security_model=none"
        -pidfile "$LAB_RUN_DIR/qemu.pid"
    )
    say "booting the guest ($mode; TCG, this takes 20-60 s)"
    if [[ "$mode" == keep ]]; then
        setsid timeout -k 10 "$limit" ip netns exec "$LAB_NETNS" "${qemu[@]}" \
            </dev/null >"$LAB_RUN_DIR/qemu.log" 2>&1 9>&- &
    else
        timeout -k 10 "$limit" ip netns exec "$LAB_NETNS" "${qemu[@]}" \
            </dev/null >"$LAB_RUN_DIR/qemu.log" 2>&1 9>&- &
    fi
    local wrapper=$!
    OWN_QEMU=1
    if ((VERBOSE)); then
        touch "$LAB_RUN_DIR/console.log"
        tail -n +1 -f "$LAB_RUN_DIR/console.log" >&2 &
        CONSOLE_TAIL_PID=$!
    fi
    local deadline
    deadline=$(($(date +%s) + BOOT_TIMEOUT_S))
    while [[ ! -e "$SHARE/ready" ]]; do
        if [[ -e "$SHARE/setup-failed" ]]; then
            show_console_tail
            lab_fail "guest setup failed: $(cat "$SHARE/setup-failed")"
        fi
        if ! kill -0 "$wrapper" 2>/dev/null; then
            cat "$LAB_RUN_DIR/qemu.log" >&2
            show_console_tail
            lab_fail "qemu exited before the guest was ready"
        fi
        if (($(date +%s) > deadline)); then
            show_console_tail
            lab_fail "guest not ready after $BOOT_TIMEOUT_S s"
        fi
        sleep 0.2
    done
    say "guest ready after $(elapsed "$t0") s: $(tr '\n' ' ' <"$SHARE/ready")"
}

# new_job TIMEOUT CMD...: queue CMD for the guest, print its ID.
new_job() {
    local timeout_s="$1" id
    shift
    (
        flock 8
        id=0
        while [[ -e "$JOBS/$id.cmd" ]]; do
            id=$((id + 1))
        done
        printf '%s\n' "$timeout_s" >"$JOBS/$id.timeout"
        {
            printf '# queued by %s at %s\n' "$PROG" "$(date -u +%FT%TZ)"
            printf 'exec'
            printf ' %q' "$@"
            printf '\n'
        } >"$JOBS/$id.cmd.tmp"
        mv "$JOBS/$id.cmd.tmp" "$JOBS/$id.cmd"
        printf '%s\n' "$id"
    ) 8>"$LAB_RUN_DIR/jobs.lock"
}

# copy_new FILE OFFSET_VAR FD: write FILE's bytes past the offset to FD.
copy_new() {
    local file="$1" fd="$3" size
    local -n off="$2"
    size="$(stat -c %s "$file" 2>/dev/null || echo 0)"
    if ((size > off)); then
        tail -c +"$((off + 1))" "$file" | head -c "$((size - off))" >&"$fd"
        off=$size
    fi
}

# stream_job ID DEADLINE_EPOCH: copy the job's stdout/stderr as they grow;
# return its exit status (124 at the deadline, LAB_FAILED if the guest died).
stream_job() {
    local id="$1" deadline="$2"
    # shellcheck disable=SC2034  # updated through namerefs in copy_new
    local out_off=0 err_off=0
    local out="$JOBS/$id.out" err="$JOBS/$id.err" status="$JOBS/$id.status"
    while :; do
        copy_new "$out" out_off 1
        copy_new "$err" err_off 2
        if [[ -e "$status" ]]; then
            copy_new "$out" out_off 1
            copy_new "$err" err_off 2
            return "$(cat "$status")"
        fi
        if ! guest_running; then
            sleep 0.5
            [[ -e "$status" ]] && continue
            show_console_tail
            printf '%s: error: the guest stopped before job %s ended\n' "$PROG" "$id" >&2
            return "$LAB_FAILED"
        fi
        if (($(date +%s) >= deadline)); then
            printf '%s: error: job %s timed out; killing it\n' "$PROG" "$id" >&2
            touch "$JOBS/$id.kill"
            local i
            for ((i = 0; i < 50; i++)); do
                [[ -e "$status" ]] && break
                sleep 0.2
            done
            copy_new "$out" out_off 1
            copy_new "$err" err_off 2
            return 124
        fi
        sleep 0.2
    done
}

cleanup_oneshot() {
    local rc=$?
    trap - EXIT INT TERM
    if ((OWN_QEMU)); then
        kill_qemu
    fi
    net_down_if_owned
    if [[ -n "$CONSOLE_TAIL_PID" ]]; then
        kill "$CONSOLE_TAIL_PID" 2>/dev/null || true
    fi
    exit "$rc"
}

cmd_run() {
    (($#)) || { usage >&2; exit 2; }
    preflight
    take_lock
    guest_running && lab_fail "a lab guest already runs for instance '$LAB_INSTANCE' (use '$PROG exec', or '$PROG stop')"
    trap cleanup_oneshot EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    local t0 deadline rc=0 id
    t0="$(now)"
    deadline=$(($(date +%s) + TIMEOUT_S))
    boot oneshot $((TIMEOUT_S + 30))
    # The guest's own limit ends the job a little before ours, so that its
    # status still comes back.
    id="$(new_job $((deadline - $(date +%s) > 20 ? deadline - $(date +%s) - 10 : 10)) "$@")"
    [[ "$id" == 0 ]] || lab_fail "internal: first job got ID $id"
    stream_job 0 "$deadline" || rc=$?
    if ! wait_qemu_exit 30; then
        warn "the guest did not power off; killing qemu"
    fi
    say "done in $(elapsed "$t0") s, exit status $rc"
    exit "$rc"
}

cmd_start() {
    preflight
    take_lock
    guest_running && lab_fail "a lab guest already runs for instance '$LAB_INSTANCE' (pid $(qemu_pid))"
    trap 'rc=$?; trap - EXIT; if ((rc != 0)); then kill_qemu; net_down_if_owned; fi; exit $rc' EXIT
    boot keep "$KEEP_TIMEOUT_S"
    trap - EXIT
    flock -u 9
    say "guest runs (qemu pid $(qemu_pid)); host side: ip netns exec $HOST_NETNS ... (guest $GUEST_ADDR); stop with: $PROG stop"
    if (($#)); then
        local id
        id="$(new_job "$TIMEOUT_S" "$@")"
        say "started job $id in the background: '$*'; collect it with: $PROG wait $id"
        printf '%s\n' "$id"
    fi
}

need_running() {
    guest_running || lab_fail "no lab guest runs for instance '$LAB_INSTANCE' (start one with '$PROG start')"
}

cmd_exec() {
    (($#)) || { usage >&2; exit 2; }
    need_root "reading the guest's run folder"
    need_running
    local id deadline
    deadline=$(($(date +%s) + TIMEOUT_S))
    id="$(new_job "$TIMEOUT_S" "$@")"
    if ((BG)); then
        printf '%s\n' "$id"
        return 0
    fi
    local rc=0
    stream_job "$id" "$deadline" || rc=$?
    exit "$rc"
}

valid_job_id() {
    if (($# != 1)) || [[ ! "$1" =~ ^[0-9]+$ ]]; then
        usage >&2
        exit 2
    fi
    [[ -e "$JOBS/$1.cmd" ]] || lab_fail "no job $1"
}

cmd_wait() {
    valid_job_id "$@"
    local rc=0
    stream_job "$1" $(($(date +%s) + TIMEOUT_S)) || rc=$?
    exit "$rc"
}

cmd_kill() {
    valid_job_id "$@"
    need_running
    touch "$JOBS/$1.kill"
}

cmd_stop() {
    need_root "stopping qemu and the lab network"
    if guest_running; then
        touch "$SHARE/poweroff"
        if ! wait_qemu_exit 30; then
            warn "the guest did not power off within 30 s; killing qemu"
            kill_qemu
        fi
        say "guest stopped"
    else
        say "no lab guest runs for instance '$LAB_INSTANCE'"
    fi
    net_down_if_owned
}

cmd_status() {
    if ! guest_running; then
        echo "instance $LAB_INSTANCE: no guest running"
        return 1
    fi
    echo "instance $LAB_INSTANCE: guest runs (qemu pid $(qemu_pid)), run folder $LAB_RUN_DIR"
    [[ -e "$SHARE/ready" ]] && sed 's/^/  /' "$SHARE/ready"
    local f id
    for f in "$JOBS"/*.cmd; do
        [[ -e "$f" ]] || continue
        id="${f##*/}"
        id="${id%.cmd}"
        if [[ -e "$JOBS/$id.status" ]]; then
            printf '  job %s: exited %s: %s\n' "$id" "$(cat "$JOBS/$id.status")" "$(tail -n1 "$f")"
        else
            printf '  job %s: running: %s\n' "$id" "$(tail -n1 "$f")"
        fi
    done
}

# --- argument parsing --------------------------------------------------------
# Options may stand before and after the subcommand; the first other word (or
# everything after --) starts CMD.
SUB=run
while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --timeout)
            [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--timeout needs a number of seconds"
            TIMEOUT_S="$2"; shift 2 ;;
        --keep) [[ "$SUB" == run ]] || die "--keep only replaces 'start'"; SUB=start; shift ;;
        --bg) BG=1; shift ;;
        -v | --verbose) VERBOSE=1; shift ;;
        -q | --quiet) QUIET=1; shift ;;
        --instance)
            [[ "${2:-}" =~ ^[A-Za-z0-9_-]+$ ]] ||
                die "--instance needs a name of letters, digits, _ and -"
            shift 2 ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see -h)" ;;
        start | exec | wait | kill | stop | status | console)
            if [[ "$SUB" == run ]]; then
                SUB="$1"
                shift
            else
                break
            fi ;;
        *) break ;;
    esac
done

case "$SUB" in
    run) cmd_run "$@" ;;
    start) cmd_start "$@" ;;
    exec) cmd_exec "$@" ;;
    wait | kill) "cmd_$SUB" "$@" ;;
    stop | status) (($# == 0)) || { usage >&2; exit 2; }; "cmd_$SUB" ;;
    console) cat "$LAB_RUN_DIR/console.log" ;;
esac
