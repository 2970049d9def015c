"""`python -m exatrain ...` is the same as `exatrain ...`."""

import sys

from exatrain.cli import main

sys.exit(main())
