"""``python -m tenure`` runs the ``tenure`` command."""

import sys

from tenure.cli import main

sys.exit(main())
