import sys

from rdmakit.cli.main import main

sys.exit(main())
