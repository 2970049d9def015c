"""Units the project prints and converts with, defined once."""

GiB = 1024**3  # bytes


def count_text(n: float, digits: int = 2) -> str:
    """A parameter count in the largest unit that leaves it at least 1: 174.62B, 12.35M, 51.20K (``digits``
    decimals), so that a small model does not read as 0.00B."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:,.{digits}f}{unit}"
    return f"{n:,.0f}"


__all__ = ["GiB", "count_text"]
