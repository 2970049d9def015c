"""The "Pictures and reports" section of docs/planning.md shows pictures that are in the repository, small,
drawn, and made by the command it names."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.report_helpers import assert_png_drawn

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    text = (ROOT / "docs" / "planning.md").read_text(encoding="utf-8")
    start = text.index("## Pictures and reports")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_readme_pictures_exist_are_small_and_drawn() -> None:
    section = _section()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section)
    assert images == ["img/gpt-1t-frontier-memory.png", "img/gpt-1t-frontier-timeline.png"]
    for rel in images:
        path = ROOT / "docs" / rel
        assert path.stat().st_size <= 200_000, f"{rel} is {path.stat().st_size} bytes"
        assert_png_drawn(path)
        # ... and the section names the command that writes it.
        assert f"docs/img/{path.name}" in section.split("```bash", 1)[1].split("```", 1)[0]
    assert "exatrain report --plan gpt-1t-frontier.json" in section
