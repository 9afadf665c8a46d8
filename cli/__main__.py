"""`python -m sleuth.cli`: the `sleuth` command."""

import sys

from sleuth.cli.main import main

sys.exit(main())
