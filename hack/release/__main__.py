"""`python -m release` (PYTHONPATH=hack): what `make release` runs."""

import sys

from release.build import main

sys.exit(main())
