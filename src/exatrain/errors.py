"""One exception type for every problem a user can fix by changing their input.

The CLI turns a `UserError` into one line on stderr and exit status 2, with no traceback.
Anything else escaping is a bug in exatrain and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: an unknown preset, indivisible degrees, a malformed file, ...

    The message names the problem and, where there is one, the fix.
    """

    exit_code = 2


class PlanError(UserError):
    """A layout that cannot run: degrees, batch sizes or stage splits do not fit together."""


class TrainingStopped(UserError):
    """A run that stopped itself (a non-finite loss under --nan-policy stop): one line, exit status 3."""

    exit_code = 3


class OutOfMemoryPredicted(PlanError):
    """A run refused before it starts because its memory is predicted not to fit (e.g. the model
    states of a CPU run beyond the machine's memory). The tuner records such a layout as out of
    memory without running it."""
