"""The project's own exceptions: the only errors that reach a user.

Everything the tuner raises on bad input or a missing device derives from
:class:`TunerError`, so the CLI and the service can turn it into a clear
message (and a non-zero exit or a 4xx) without catching unrelated bugs.
Every package raises them, so they stand on the bottom floor and import
nothing of the project; :mod:`tuner` re-exports them (``from tuner import TunerError``).
"""

from __future__ import annotations


class TunerError(Exception):
    """Root of every error this project raises on purpose."""


class MatrixFormatError(TunerError, ValueError):
    """A matrix (file, SciPy/CuPy object or triple) that cannot be read or is not supported."""


class NoDeviceError(TunerError, RuntimeError):
    """A GPU path was asked for, but CuPy or a CUDA device is not available."""


class InvalidConfigError(TunerError, ValueError):
    """A kernel name or parameter value that the registry does not declare."""


class NotApplicableError(InvalidConfigError):
    """A kernel family that cannot run, or cannot pay, on this matrix whatever its parameters (rcm: no narrow
    order; rowsort: rows in order already, or scattered whatever their order), raised by its preparation with
    the reason: a race drops the family, a search samples it no more on that matrix."""


class StoreError(TunerError, RuntimeError):
    """The SQLite store cannot be opened, migrated or written."""
