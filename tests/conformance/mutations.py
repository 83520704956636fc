"""A target agent with one deliberate engine bug: ``python -m tests.conformance.mutations NAME ARGS...``.

Plants the mutation (:mod:`tests.conformance.mutants`), then runs
``rdmakit conformance-target AGENT-ARGS`` on the pure-Python data plane. The
suite then drives that agent like any other, through ``--target``.
"""

import os
import sys

from tests.conformance.mutants import MUTATIONS, apply

__all__ = ["MUTATIONS", "apply"]

if __name__ == "__main__":
    os.environ["RDMAKIT_PURE_PYTHON"] = "1"
    apply(sys.argv[1])
    from rdmakit.cli.main import main

    sys.exit(main(["conformance-target", *sys.argv[2:]]))
