#!/bin/bash
# Runs one job inside the lab guest (started by guest-init.sh in its own
# session): cwd = the checkout, locked-memory limit lifted for verbs.
set -uo pipefail
id="$1"
jobs=/mnt/labrun/jobs
timeout_s="$(cat "$jobs/$id.timeout" 2>/dev/null || echo 900)"
(
    cd /mnt/rdmakit || exit 125
    ulimit -l unlimited
    exec timeout -k 5 "$timeout_s" bash "$jobs/$id.cmd" >"$jobs/$id.out" 2>"$jobs/$id.err" </dev/null
)
rc=$?
if ((rc == 124)); then
    printf 'lab: job timed out after %s s\n' "$timeout_s" >>"$jobs/$id.err"
fi
echo "$rc" >"$jobs/$id.status.tmp" && mv "$jobs/$id.status.tmp" "$jobs/$id.status"
