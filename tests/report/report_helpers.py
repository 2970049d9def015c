"""Helpers shared by the report tests (imported by name: tests run in pytest's prepend import mode)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def assert_png_drawn(path: Path) -> np.ndarray:
    """The PNG opens, has a sensible size, and is not blank: its pixels vary and hold more than one
    colour. Returns the RGB pixels."""
    from PIL import Image

    assert path.is_file(), path
    with Image.open(path) as im:
        assert im.format == "PNG"
        rgb = np.asarray(im.convert("RGB"))
    assert rgb.shape[0] >= 200 and rgb.shape[1] >= 400, rgb.shape
    assert float(rgb.var()) > 0.0
    assert bool((rgb != rgb[0, 0]).any())  # more than one colour
    return rgb
