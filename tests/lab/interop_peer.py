"""One side of the soft-engine <-> kernel-rxe interop test (tests/lab/test_interop.py).

The exchange itself is :mod:`rdmakit.testing.rcpeer`; this file runs it by path.
"""

import sys

from rdmakit.testing.rcpeer import main

if __name__ == "__main__":
    sys.exit(main())
