"""Training, by command line or by call.

    torchrun --nproc-per-node N -m exatrain.train --plan plan.json    # what launchers run
    exatrain.train(model="gpt-tiny", tp=2, steps=10)                  # the Python API

``python -m exatrain.train ...`` is ``exatrain train ...``; calling this module is calling
``exatrain.api.train`` (see there for the keyword arguments and the TrainResult it returns).
"""

from __future__ import annotations

import sys
import types


def main() -> int:
    from exatrain.cli import main as cli_main

    return cli_main(["train", *sys.argv[1:]])


class _CallableModule(types.ModuleType):
    """This module, callable: ``exatrain.train(...)`` runs ``exatrain.api.train(...)``."""

    def __call__(self, *args, **kwargs):
        from exatrain.api.training import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
