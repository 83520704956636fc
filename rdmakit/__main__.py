"""``python -m rdmakit``.

Run from the directory that holds a clone named ``rdmakit``, the current
directory comes first on ``sys.path`` and that folder shadows the installed
package as an empty namespace package. Then the program starts again with
``-P`` (Python 3.11: the current directory stays off ``sys.path``).
"""

import os
import sys

_package = sys.modules.get("rdmakit")
if getattr(_package, "__file__", None) is None and not sys.flags.safe_path:
    os.execv(sys.executable, [sys.executable, "-P", "-m", "rdmakit", *sys.argv[1:]])

from rdmakit.cli.main import main  # noqa: E402

sys.exit(main())
