"""The host side of tests/lab/test_perftest_interop.py: an rdmakit program, then its device's counters.

Usage: perftest_host.py ADDR RDMAKIT-ARGS...

Runs ``rdmakit RDMAKIT-ARGS`` (``perftest NAME ...`` or ``rc-pingpong ...``
with ``-d ADDR``) in this process while holding the soft device on ADDR open,
so its counters outlive the program; prints each QP's engine statistics as
it closes (``QP_STATS {json}``, for diagnosis) and the device's counters on
stderr as the last line, ``COUNTERS {json}`` (the change over the run; QP1's
as ``gsi_*``), and
exits with the program's status.
"""

import json
import sys

from rdmakit.cli import bench_qp
from rdmakit.cli.main import main
from rdmakit.doca.soft import SoftBackendDevice

_close = bench_qp.TestQp.close
_FIELDS = ("packets_in", "packets_out", "retransmits", "duplicates", "naks_sent", "naks_received", "dropped")


def _close_reporting(self: bench_qp.TestQp) -> None:
    stats = getattr(self.qp, "engine_qp", None)
    if stats is not None:
        s = stats.stats
        fields = (
            "packets_in",
            "packets_out",
            "retransmits",
            "duplicates",
            "naks_sent",
            "naks_received",
            "dropped",
        )
        print(
            "QP_STATS " + json.dumps({f: getattr(s, f) for f in fields}, default=str),
            file=sys.stderr,
            flush=True,
        )
    _close(self)


def _counters(dev: SoftBackendDevice) -> dict[str, int]:
    """The device's counters, and its QP1's (``gsi_*``: the connection manager's MADs, -R)."""
    counters = dev.soft.counters.as_dict()
    gsi = dev.soft.gsi
    counters.update({f"gsi_{k}": v for k, v in (gsi.counters.as_dict() if gsi is not None else {}).items()})
    return counters


def run(argv: list[str]) -> int:
    ip, args = argv[0], argv[1:]
    bench_qp.TestQp.close = _close_reporting  # type: ignore[method-assign]
    held = SoftBackendDevice("roce-udp", ip)
    try:
        before = _counters(held)
        rc = main(args)
        after = _counters(held)
    finally:
        held.close()
    sys.stdout.flush()
    print("COUNTERS " + json.dumps({k: after[k] - before[k] for k in after}), file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
