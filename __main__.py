"""`python -m redline` is the `redline` command."""

import sys

from redline.cluster.cli import main

sys.exit(main())
