#!/usr/bin/env bash
# Run the README's install-and-demo command as a new user would: in a fresh clone of this
# repository, from a bare python3 (a new virtual environment without the system's site
# packages, no PYTHONPATH, no user site). With --tests, the README's test command too
# (the whole suite: CI runs that one as its test step instead).
set -euo pipefail

usage() {
    cat <<USAGE
Usage: ${0##*/} [--tests] [-h]

Clone this repository (its committed HEAD) into a temporary directory and run
there, verbatim, the README's command that starts with 'python3 -m venv' and
ends with 'rdmakit demo'; with --tests, also its test command. Exit status:
that of the first command that fails.
USAGE
}

run_tests=0
for arg in "$@"; do
    case "$arg" in
        --tests) run_tests=1 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done

repo=$(cd "$(dirname "$0")/.." && pwd)
demo_cmd=$(grep -m1 -E '^python3 -m venv .*pip install .*rdmakit demo$' "$repo/README.md" || true)
test_cmd=$(grep -m1 -E '^python3 -m venv .*pip install .*pytest' "$repo/README.md" || true)
[ -n "$demo_cmd" ] || { echo "README.md has no install-and-demo command" >&2; exit 1; }
[ -n "$test_cmd" ] || { echo "README.md has no test command" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/rdmakit"
cd "$work/rdmakit"

# A bare python3: nothing of this shell's Python environment leaks in.
clean=(env -u PYTHONPATH -u VIRTUAL_ENV -u PYTHONHOME -u PYTHONSTARTUP PYTHONNOUSERSITE=1
       PIP_DISABLE_PIP_VERSION_CHECK=1 PATH="$(getconf PATH):/usr/local/bin")
if (cd / && "${clean[@]}" python3 -c 'import rdmakit' 2>/dev/null); then
    echo "python3 imports rdmakit before the install: the check would prove nothing" >&2
    exit 1
fi

echo "+ $demo_cmd"
start=$(date +%s)
"${clean[@]}" bash -c "$demo_cmd" > demo.out
tail -n 1 demo.out
grep -qx 'all operations verified' demo.out
echo "install and demo: $(($(date +%s) - start)) s"
if .venv/bin/python -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    :
else
    echo "the command did not make a virtual environment" >&2
    exit 1
fi

if [ "$run_tests" = 1 ]; then
    echo "+ $test_cmd"
    "${clean[@]}" bash -c "$test_cmd"
fi
