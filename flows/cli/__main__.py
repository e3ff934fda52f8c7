"""`python -m flows.cli COMMAND ...`: the same entry point as the `dpicl` script."""

import sys

from flows.cli import main

sys.exit(main())
