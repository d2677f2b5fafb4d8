import sys

from bf16k.cli import main

sys.exit(main())
