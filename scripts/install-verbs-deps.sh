#!/usr/bin/env bash
# Install the verbs userspace on a Debian machine that has an RDMA device
# (a real RNIC, or a kernel with rdma_rxe: see scripts/rxe-setup.sh).
#
# pyverbs: use Debian's python3-pyverbs. On bookworm the PyPI "pyverbs" sdist
# is all of a newer rdma-core; it builds (slowly, and only with Cython 3.0.x)
# and then fails to import against bookworm's libibverbs 44
# ("version IBVERBS_PRIVATE_59 not found"). Debian's module is built for the
# system Python 3.11 and is importable from any Python 3.11: a venv made with
# --system-site-packages, or PYTHONPATH=/usr/lib/python3/dist-packages.
set -euo pipefail

PACKAGES=(rdma-core ibverbs-utils ibverbs-providers rdmacm-utils python3-pyverbs perftest iproute2)

usage() {
    cat <<USAGE
Usage: ${0##*/} [-h]

Install the RDMA verbs userspace with apt (--no-install-recommends):
  ${PACKAGES[*]}
ibverbs-providers holds the device drivers (rxe, mlx5, ...): it is only a
recommendation of libibverbs1, so it is named explicitly.

For pyverbs use Debian's python3-pyverbs, not PyPI's (which does not import
against bookworm's libibverbs 44). From a virtualenv:
  python3.11 -m venv --system-site-packages .venv
or from another Python 3.11:
  PYTHONPATH=/usr/lib/python3/dist-packages python3.11 -c 'import pyverbs'
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
