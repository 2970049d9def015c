"""index.html: every picture of a report with its caption and key numbers, in one static page.

The page references only the PNGs written beside it, by relative name, so the folder can be moved,
zipped or served as it is; it has no scripts and no external resources.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from exatrain.report.style import Figure

_CSS = """body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1240px;margin:2em auto;
padding:0 1em;color:#222}h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;
margin-top:2em}figure{margin:1.2em 0}img{max-width:100%;border:1px solid #eee}figcaption{font-size:.9em;
color:#444;margin:.4em 0}table{border-collapse:collapse;font-size:.85em;margin:.3em 0 1em}td{padding:.15em .8em
.15em 0;vertical-align:top}td:first-child{color:#666}.src{color:#666;font-size:.85em}.note{color:#8a5a00}"""


@dataclass(frozen=True)
class Section:
    """The pictures made from one input file, and what could not be drawn from it (and why)."""

    title: str
    source: str
    figures: tuple[Figure, ...]
    notes: tuple[str, ...] = ()


def _figure(f: Figure) -> str:
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in f.key_numbers)
    table = f"<table>{rows}</table>" if rows else ""
    return (
        f'<figure><img src="{html.escape(f.file, quote=True)}" alt="{html.escape(f.title, quote=True)}">'
        f"<figcaption><b>{html.escape(f.title)}.</b> {html.escape(f.caption)}</figcaption>{table}</figure>"
    )


def render_index(sections: Sequence[Section], title: str = "exatrain report") -> str:
    """The whole page as a string."""
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"
    ]
    n = sum(len(s.figures) for s in sections)
    parts.append(
        f"<p>{n} picture{'s' if n != 1 else ''} from {len(sections)} input"
        f"{'s' if len(sections) != 1 else ''}, made by <code>exatrain report</code>.</p>"
    )
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2><p class='src'>from <code>{html.escape(s.source)}</code></p>")
        parts.extend(_figure(f) for f in s.figures)
        parts.extend(f"<p class='note'>{html.escape(note)}</p>" for note in s.notes)
    parts.append("</body></html>\n")
    return "".join(parts)


def write_index(sections: Sequence[Section], folder: Path) -> Path:
    """Write index.html into ``folder``; every picture it names must already be there."""
    missing = [f.file for s in sections for f in s.figures if not (folder / f.file).is_file()]
    if missing:
        raise RuntimeError(f"index.html would reference missing pictures: {', '.join(missing)}")
    path = folder / "index.html"
    path.write_text(render_index(sections), encoding="utf-8")
    return path
