"""Entry point for launchers: ``torchrun --nproc-per-node N -m exatrain.train --plan plan.json``.

The same as ``exatrain train ...``: the CLI is the only place that reads argv.
"""

from __future__ import annotations

import sys


def main() -> int:
    from exatrain.cli import main as cli_main

    return cli_main(["train", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
