"""The host side of tests/lab/test_perftest_interop.py: an rdmakit program, then its device's counters.

Usage: perftest_host.py ADDR RDMAKIT-ARGS...

Runs ``rdmakit RDMAKIT-ARGS`` (``perftest NAME ...`` or ``rc-pingpong ...``
with ``-d ADDR``) in this process while holding the soft device on ADDR open,
so its counters outlive the program; prints them on stderr as the last line,
``COUNTERS {json}`` (the change over the run), and exits with the program's
status.
"""

import json
import sys

from rdmakit.cli.main import main
from rdmakit.doca.soft import SoftBackendDevice


def run(argv: list[str]) -> int:
    ip, args = argv[0], argv[1:]
    held = SoftBackendDevice("roce-udp", ip)
    try:
        before = held.soft.counters.as_dict()
        rc = main(args)
        after = held.soft.counters.as_dict()
    finally:
        held.close()
    sys.stdout.flush()
    print("COUNTERS " + json.dumps({k: after[k] - before[k] for k in after}), file=sys.stderr, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
