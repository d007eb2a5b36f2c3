"""`python -m asyncppo` runs the command line."""

import sys

from asyncppo.cli.main import main

sys.exit(main())
