"""`python -m redline` is the `redline` command."""

import sys

from redline.cli import main

sys.exit(main())
