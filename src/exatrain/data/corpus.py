"""The built-in corpus: the text ``exatrain train`` learns when no ``--data`` is given.

It is generated here, deterministically, from word lists and templates written for this project
(no third-party text): prose paragraphs, small Python functions, key-value records and number
tables, so a byte-level model has spelling, grammar, indentation and formats to learn. The only
source of variety is a fixed-seed SplitMix64 generator in integer arithmetic (Steele, Lea & Flood
2014, "Fast splittable pseudorandom number generators", the ``mix64`` finaliser as in Java's
SplittableRandom), never ``random`` or ``hash``, so every Python version, platform and library
version produces the same bytes; ``SHA256`` records them and ``documents`` checks it, so a run's
first losses are the same on every machine.
"""

from __future__ import annotations

import hashlib
from typing import Iterator

SEED = 20240611
DOCUMENTS = 1500  # about 1 MB of text: thousands of training windows at every preset's sequence length
# sha256 of the documents joined by NUL (the byte tokenizer's separator); tests/data/test_corpus.py checks it.
SHA256 = "564335a9d1d89b0864983d3936bc1479e87140ef97a72df05f11eb6591749314"

_MASK = (1 << 64) - 1


class SplitMix64:
    """SplitMix64 (Steele, Lea & Flood 2014): a 64-bit counter through a bijective mixing function."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """An integer in [0, n) (the modulo bias, under 2**-50 here, does not matter for text)."""
        return self.next() % n

    def pick(self, items: tuple):
        return items[self.below(len(items))]


NOUNS = (
    "river",
    "mountain",
    "village",
    "engine",
    "garden",
    "library",
    "harbor",
    "bridge",
    "forest",
    "market",
    "tower",
    "valley",
    "station",
    "window",
    "lantern",
    "ship",
    "road",
    "field",
    "workshop",
    "school",
    "orchard",
    "island",
    "castle",
    "mill",
    "bakery",
    "clock",
    "letter",
    "map",
    "storm",
    "cloud",
    "teacher",
    "farmer",
    "sailor",
    "painter",
    "doctor",
    "child",
    "traveler",
    "merchant",
    "musician",
    "builder",
    "machine",
    "signal",
    "network",
    "server",
    "pipeline",
    "stage",
    "layer",
    "model",
    "batch",
    "gradient",
)
ADJECTIVES = (
    "quiet",
    "bright",
    "old",
    "narrow",
    "broad",
    "small",
    "large",
    "green",
    "silver",
    "warm",
    "cold",
    "careful",
    "patient",
    "busy",
    "distant",
    "hidden",
    "steady",
    "gentle",
    "heavy",
    "simple",
    "early",
    "late",
    "empty",
    "crowded",
    "northern",
    "southern",
    "wooden",
    "stone",
    "golden",
    "tired",
)
VERBS = (
    "watched",
    "followed",
    "crossed",
    "built",
    "carried",
    "opened",
    "painted",
    "measured",
    "repaired",
    "visited",
    "described",
    "found",
    "counted",
    "cleaned",
    "moved",
    "lifted",
    "checked",
    "signed",
    "sent",
    "drew",
    "answered",
    "trained",
    "planned",
    "reached",
    "joined",
)
PREPOSITIONS = ("near", "behind", "above", "below", "beside", "across", "inside", "around", "toward", "beyond")
TIMES = (
    "in the morning",
    "at noon",
    "before dawn",
    "after the rain",
    "every spring",
    "late at night",
    "on the first day",
    "during the winter",
    "once a week",
    "at the end of the year",
)
ADVERBS = ("slowly", "quickly", "carefully", "quietly", "again", "together", "at last", "once more", "gladly")
FIRST_NAMES = (
    "Ada",
    "Boris",
    "Chen",
    "Dara",
    "Emil",
    "Fatima",
    "Goran",
    "Hana",
    "Ivo",
    "Jun",
    "Kira",
    "Luca",
    "Mira",
    "Nils",
    "Olga",
    "Pavel",
    "Rosa",
    "Sami",
    "Tara",
    "Uma",
    "Vera",
    "Wim",
    "Yara",
    "Zeno",
)
CITIES = ("Lyon", "Oslo", "Kyoto", "Quito", "Perth", "Cork", "Turin", "Tartu", "Bergen", "Leeds", "Graz", "Split")
COLORS = ("red", "blue", "green", "yellow", "white", "black", "gray", "orange")
CONNECTIVES = ("Then", "Later", "Meanwhile", "Afterwards", "Still", "Soon", "By evening", "In the end")
VARIABLES = (
    ("value", "values"),
    ("count", "counts"),
    ("item", "items"),
    ("width", "widths"),
    ("height", "heights"),
    ("step", "steps"),
    ("size", "sizes"),
    ("index", "indices"),
    ("score", "scores"),
    ("weight", "weights"),
    ("limit", "limits"),
    ("offset", "offsets"),
    ("rate", "rates"),
)
ACCUMULATORS = ("total", "result", "acc", "best", "mean", "out")
FUNCTIONS = (
    "scale",
    "clip",
    "average",
    "count",
    "merge",
    "split",
    "shift",
    "measure",
    "normalize",
    "collect",
    "filter",
    "pack",
)
OPERATORS = ("+", "-", "*")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _sentence(r: SplitMix64) -> str:
    n1, n2, a1, a2 = r.pick(NOUNS), r.pick(NOUNS), r.pick(ADJECTIVES), r.pick(ADJECTIVES)
    kind = r.below(6)
    if kind == 0:
        s = f"the {a1} {n1} {r.pick(VERBS)} the {n2} {r.pick(TIMES)}"
    elif kind == 1:
        s = f"{r.pick(FIRST_NAMES)} {r.pick(VERBS)} {_article(a1)} {a1} {n1} {r.pick(PREPOSITIONS)} the {n2}"
    elif kind == 2:
        s = f"{r.pick(CONNECTIVES).lower()} the {n1} {r.pick(VERBS)} the {a2} {n2} {r.pick(ADVERBS)}"
    elif kind == 3:
        s = f"there was {_article(a1)} {a1} {n1} {r.pick(PREPOSITIONS)} the {a2} {n2}"
    elif kind == 4:
        s = f"{r.pick(FIRST_NAMES)} and {r.pick(FIRST_NAMES)} {r.pick(VERBS)} the {n1} of the {n2} {r.pick(TIMES)}"
    else:
        s = f"the {n1} was {a1}, and the {n2} was {r.pick(COLORS)}"
    return s[0].upper() + s[1:] + "."


def _prose(r: SplitMix64) -> str:
    title = f"The {r.pick(ADJECTIVES).title()} {r.pick(NOUNS).title()}"
    paragraphs = []
    for _ in range(2 + r.below(4)):
        paragraphs.append(" ".join(_sentence(r) for _ in range(3 + r.below(5))))
    return title + "\n\n" + "\n\n".join(paragraphs) + "\n"


def _code(r: SplitMix64) -> str:
    blocks = []
    for _ in range(2 + r.below(3)):
        fn, noun = r.pick(FUNCTIONS), r.pick(NOUNS)
        (var, arg), acc = r.pick(VARIABLES), r.pick(ACCUMULATORS)
        k = 1 + r.below(9)
        op = r.pick(OPERATORS)
        lines = [
            f"def {fn}_{noun}({arg}, factor={k}):",
            f'    """{fn.title()} every {noun} {r.pick(PREPOSITIONS)} the {r.pick(NOUNS)}."""',
            f"    {acc} = {r.below(3)}",
            f"    for {var} in {arg}:",
        ]
        if r.below(2):
            lines += [
                f"        if {var} > {r.below(100)}:",
                f"            {acc} = {acc} {op} {var} * factor",
                "        else:",
                f"            {acc} = {acc} {r.pick(OPERATORS)} {var}",
            ]
        else:
            lines.append(f"        {acc} {op}= {var} * factor")
        lines.append(f"    return {acc}")
        blocks.append("\n".join(lines))
    return "\n\n\n".join(blocks) + "\n"


def _records(r: SplitMix64) -> str:
    rows = ["name,city,age,color,visits"]
    for _ in range(6 + r.below(20)):
        rows.append(f"{r.pick(FIRST_NAMES)},{r.pick(CITIES)},{18 + r.below(70)},{r.pick(COLORS)},{r.below(1000)}")
    return "\n".join(rows) + "\n"


def _numbers(r: SplitMix64) -> str:
    lines = []
    for _ in range(8 + r.below(16)):
        a, b = r.below(100), r.below(100)
        op = r.pick(OPERATORS)
        result = a + b if op == "+" else a - b if op == "-" else a * b
        lines.append(f"{a} {op} {b} = {result}")
    return "\n".join(lines) + "\n"


_KINDS = (_prose, _prose, _prose, _code, _code, _records, _numbers)


def generate(count: int = DOCUMENTS, seed: int = SEED) -> Iterator[str]:
    """The corpus's documents, in order (each a str of ASCII text)."""
    r = SplitMix64(seed)
    for _ in range(count):
        yield _KINDS[r.below(len(_KINDS))](r)


def digest(texts: list[str]) -> str:
    """sha256 of the documents joined and ended by NUL, as the byte tokenizer's stream holds them."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()


def documents() -> list[str]:
    """The built-in corpus, checked against ``SHA256`` (an AssertionError would be a bug here, never a user's)."""
    texts = list(generate())
    got = digest(texts)
    if got != SHA256:
        raise AssertionError(f"the built-in corpus generated {got}, not the recorded {SHA256}")
    return texts


__all__ = ["DOCUMENTS", "SEED", "SHA256", "SplitMix64", "digest", "documents", "generate"]
