"""``python -m benchmarks NAME ...``: the same as ``tenure bench NAME ...`` in a clone."""

import sys

from benchmarks.command import main

sys.exit(main(sys.argv[1:]))
