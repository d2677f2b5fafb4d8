"""`python -m verify.live ...`: see `verify.live.cli` for the options."""

import sys

from verify.live.cli import main

if __name__ == "__main__":
    sys.exit(main())
