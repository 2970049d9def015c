"""Units the project prints and converts with, defined once."""

GiB = 1024**3  # bytes

__all__ = ["GiB"]
