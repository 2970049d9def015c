#!/usr/bin/env bash
# Install exatrain (editable, every extra) for `make install` / `make run` / `make test`.
#
#   bash scripts/install.sh                 install, or say it is up to date
#   bash scripts/install.sh --dry-run       print what it would do, change nothing
#   bash scripts/install.sh --print-python  print the interpreter the make targets run
#
# PYTHON (default python3) is the interpreter to start from; VENV (default .venv) the project-local
# virtual environment made when PYTHON is not already a virtual or conda environment.
# This file only makes sure PYTHON exists and is new enough to run scripts/install_env.py, which
# decides and does the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "install: no Python at '$PY': install Python >= 3.10 or set PYTHON=/path/to/python3" >&2
  exit 2
fi
if ! ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
  echo "install: '$PY' does not run as a Python interpreter: set PYTHON=/path/to/python3 (>= 3.10)" >&2
  exit 2
fi
major=${ver%%.*}
minor=${ver#*.}
if [ "$major" -lt 3 ] || { [ "$major" -eq 3 ] && [ "$minor" -lt 10 ]; }; then
  echo "install: exatrain needs Python >= 3.10; '$PY' is $ver: set PYTHON=/path/to/python3.10-or-newer" >&2
  exit 2
fi
exec "$PY" scripts/install_env.py "$@"
