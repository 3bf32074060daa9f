"""``python -m tenure`` runs the ``tenure`` command."""

import sys

from tenure._tools.cli import main

sys.exit(main())
