#!/usr/bin/env bash
# Build the documentation site into docs/_build/html: the guides in docs/*.md
# and the API reference generated from the docstrings. Warnings are errors and
# every cross-reference must resolve (-n), links between the pages included.
# Needs the docs extra: pip install -e ".[docs]"
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m sphinx -W --keep-going -n -b html docs docs/_build/html "$@"
