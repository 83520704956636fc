#!/usr/bin/env bash
# Build rdmakit's native data plane (rdmakit/transport/_fastpath.c) once with
# AddressSanitizer and UBSan into a temporary directory (the normal build is
# left alone), then run the native tests and a bounded, seeded fuzz run of its
# functions with hostile bytes and arguments under them.
#
#   scripts/native-sanitize.sh [--count N] [--seed N]
#
# The interpreter is not instrumented, so libasan is preloaded; leak checking
# is off (CPython keeps its interned objects to the end). Python allocates
# through malloc (PYTHONMALLOC=malloc) so that ASan sees the bounds of the
# buffers the module is handed. Any sanitizer report aborts the run. The last
# line says how it went; the exit status is 0 only if everything passed.
set -euo pipefail

count=20000
seed=20240601
while [ $# -gt 0 ]; do
    case "$1" in
        --count) count="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        *) echo "usage: $0 [--count N] [--seed N]" >&2; exit 2 ;;
    esac
done

here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
cc="${CC:-gcc}"
work="$(mktemp -d "${TMPDIR:-/tmp}/rdmakit-sanitize.XXXXXX")"
trap 'rm -rf "$work"' EXIT

fail() {
    echo "native-sanitize: FAILED: $*"
    exit 1
}

libasan="$("$cc" -print-file-name=libasan.so)"
[ -e "$libasan" ] || fail "no libasan.so for $cc (install the compiler's sanitizer runtime)"

# A copy of the package and its tests, so that the sanitized module is the one imported.
cp -r "$here/rdmakit" "$here/tests" "$here/pyproject.toml" "$work/"
cp "$here/scripts/native_fuzz.py" "$here/scripts/native_fuzz_armed.py" "$here/scripts/native_fuzz_loop.py" "$here/scripts/native_fuzz_post.py" "$work/"
find "$work/rdmakit" -name '_fastpath*.so' -delete
find "$work" -name '__pycache__' -type d -prune -exec rm -rf {} +

include="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
suffix="$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
out="$work/rdmakit/transport/_fastpath$suffix"
"$cc" -shared -fPIC -std=gnu11 -O1 -g -fno-omit-frame-pointer -fno-strict-aliasing -Wall -Wextra \
    -fsanitize=address,undefined -fno-sanitize-recover=all \
    -I"$include" "$here/rdmakit/transport/_fastpath.c" -o "$out" || fail "the sanitized build"

export LD_PRELOAD="$libasan${LD_PRELOAD:+:$LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONMALLOC=malloc
export PYTHONPATH="$work"
unset RDMAKIT_PURE_PYTHON
cd "$work"

loaded="$("$python" -c 'from rdmakit.transport import fastpath; import rdmakit.transport._fastpath as m; print(m.__file__ if fastpath.native is m else "")')"
[ "$loaded" = "$out" ] || fail "the sanitized module is not the one imported (got '${loaded}')"

tests_log="$work/tests.log"
if ! "$python" -m pytest -q -p no:cacheprovider -p no:xdist -o addopts="" tests/transport/test_native*.py tests/transport/test_armed.py \
    tests/engine/test_engine_small_native.py tests/engine/test_engine_armed_writes.py tests/engine/test_engine_small_tx.py tests/engine/test_engine_armed_req.py tests/engine/test_engine_armed_reads.py tests/engine/test_engine_native_post.py \
    tests/transport/test_ack_batch.py tests/transport/test_icrc_one_pass.py tests/transport/test_train_tail.py \
    tests/transport/test_native_wait.py \
    tests/transport/test_faults.py::test_a_kernel_senders_write_packets_take_the_native_path_with_its_ip_ids -k "not mutant" \
    >"$tests_log" 2>&1; then
    tail -n 60 "$tests_log"
    fail "the native tests under ASan+UBSan"
fi
passed="$(grep -Eo '[0-9]+ passed' "$tests_log" | tail -n 1)"

fuzz_log="$work/fuzz.log"
if ! "$python" native_fuzz.py --count "$count" --seed "$seed" >"$fuzz_log" 2>&1; then
    tail -n 60 "$fuzz_log"
    fail "the fuzz run (seed $seed, count $count) under ASan+UBSan"
fi

echo "native-sanitize: OK: ASan+UBSan build; native tests: ${passed:-?}; $(tail -n 1 "$fuzz_log")"
