"""``python -m tce.cli``: the ``tce`` command (:mod:`tce.tools.cli`)."""

import sys

from tce.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
