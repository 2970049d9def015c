"""Just enough of bash to read a launch script: words, quotes, line continuations, comments, variables and
arrays assigned in the script (with ``${VAR:-default}`` and ``$((arithmetic))``), and here-documents.

``run_script`` walks the script top to bottom, applying assignments as it meets them (control flow is not
followed: every assignment counts, in order), and returns each command's words after expansion. What it cannot
know — a variable never assigned, a command substitution — stays in the word as written (``$TP``,
``$(nproc)``), so the reader that needs the value can name it.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.S)
_SEPARATORS = (";", "&&", "||", "|", "&", "\n")
_DECLARE = ("export", "declare", "local", "readonly", "typeset")


@dataclass
class Script:
    """A script read: its commands (expanded words), the variables it assigns, its here-documents by target file,
    and its ``#SBATCH`` options."""

    commands: list[list[str]] = field(default_factory=list)
    variables: dict[str, list[str]] = field(default_factory=dict)  # a scalar is a one-element list
    heredocs: dict[str, str] = field(default_factory=dict)  # `cat > FILE <<EOF` bodies, by FILE
    sbatch: list[str] = field(default_factory=list)  # the words of every #SBATCH line


def run_script(text: str) -> Script:
    """The script's commands and variables, read as the module doc says."""
    script = Script()
    script.sbatch = [
        w
        for line in text.splitlines()
        if line.lstrip().startswith("#SBATCH")
        for w in line.split()[1:]
        if not w.startswith("#")
    ]
    _Reader(text, script).read()
    return script


class _Reader:
    def __init__(self, text: str, script: Script) -> None:
        self.s = text.replace("\r\n", "\n")
        self.i = 0
        self.script = script
        self.pending_heredocs: list[tuple[str, bool]] = []  # (delimiter, strip tabs) of this line's here-documents
        self.target = ""  # the file this line's output is redirected to (a here-document's destination)
        self._raw = ""  # the text of the last expansion, as written

    # ---- the command loop --------------------------------------------------------------------------
    def read(self) -> None:
        words: list[str | tuple[str, list[str]]] = []  # a tuple is an array assignment (name+op, elements)
        while True:
            token = self._token()
            if token is None or token in _SEPARATORS:
                if words:
                    self._command(words)
                words = []
                if token == "\n":
                    self._heredoc_bodies()
                if token is None:
                    return
                continue
            words.extend(token)

    def _command(self, words: list) -> None:
        """Apply the leading assignments; record the rest as a command (with its here-document target)."""
        k = 0
        if words and isinstance(words[0], str) and words[0] in _DECLARE:
            k = 1
            while k < len(words) and isinstance(words[k], str) and words[k].startswith("-"):
                k += 1
            only_assignments = True
        else:
            only_assignments = False
        assigned: dict[str, list[str]] = {}
        while k < len(words):
            w = words[k]
            if isinstance(w, tuple):
                name, elements = w
                append = name.endswith("+")
                name = name.rstrip("+")
                assigned[name] = (self.script.variables.get(name, []) if append else []) + elements
            else:
                m = _ASSIGN.fullmatch(w)
                if not m or (not only_assignments and w.startswith("-")):
                    break
                name, plus, value = m.groups()
                old = self.script.variables.get(name, [""])
                assigned[name] = [old[0] + value if plus else value] + (old[1:] if plus else [])
            k += 1
        rest = [w for w in words[k:] if isinstance(w, str)]
        if not rest or only_assignments:
            self.script.variables.update(assigned)  # a bare assignment, or export NAME=...
        if rest and not only_assignments:
            self.script.commands.append(rest)

    # ---- tokens --------------------------------------------------------------------------------------
    def _token(self) -> list | str | None:
        """The next separator (a string), or the words of the next shell word (a list: a "${A[@]}" gives several;
        an array assignment NAME=( ... ) one tuple), or None at the end."""
        s = self.s
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        if self.i >= len(s):
            return None
        c = s[self.i]
        if c == "\\" and s[self.i + 1 : self.i + 2] == "\n":  # line continuation
            self.i += 2
            return self._token()
        if c == "#":
            while self.i < len(s) and s[self.i] != "\n":
                self.i += 1
            return self._token()
        for sep in ("&&", "||", ";", "|", "&", "\n"):
            if s.startswith(sep, self.i):
                self.i += len(sep)
                return sep
        if s.startswith("<<", self.i):
            return self._heredoc_start()
        if c in "<>":
            return self._redirect()
        m = _ASSIGN.match(s, self.i)
        if m and s.startswith("(", m.start(3)) and not s.startswith("((", m.start(3)):
            name = m.group(1) + m.group(2)
            self.i = m.start(3) + 1
            return [(name, self._array_elements())]
        return self._word()

    def _array_elements(self) -> list[str]:
        elements: list[str] = []
        while True:
            while self.i < len(self.s) and self.s[self.i] in " \t\n":
                self.i += 1
            if self.i >= len(self.s):
                return elements
            if self.s[self.i] == ")":
                self.i += 1
                return elements
            if self.s[self.i] == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
                continue
            if self.s.startswith("\\\n", self.i):
                self.i += 2
                continue
            elements.extend(w for w in self._word(stop=")") if isinstance(w, str))

    def _redirect(self) -> list:
        """A redirection (> FILE, 2>&1, < FILE): skipped, but `> FILE` is remembered for a here-document."""
        s = self.s
        while self.i < len(s) and s[self.i] in "<>&0123456789":
            self.i += 1
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        target = self._word()
        self.target = target[0] if target else ""
        return []

    def _heredoc_start(self) -> list:
        self.i += 2
        strip = self.s.startswith("-", self.i)
        self.i += strip
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1
        word = self._word()
        delimiter = word[0] if word and isinstance(word[0], str) else ""
        self.pending_heredocs.append((delimiter, strip))
        return []

    def _heredoc_bodies(self) -> None:
        target, self.target = self.target, ""
        for delimiter, strip in self.pending_heredocs:
            lines = []
            while self.i < len(self.s):
                end = self.s.find("\n", self.i)
                end = len(self.s) if end < 0 else end
                line = self.s[self.i : end]
                self.i = end + 1
                if (line.lstrip("\t") if strip else line) == delimiter:
                    break
                lines.append(line)
            if target:
                self.script.heredocs[target] = "\n".join(lines) + "\n"
                target = ""  # a second here-document on the line goes to stdin
        self.pending_heredocs = []

    def _word(self, stop: str = "") -> list[str]:
        """One shell word, expanded: unquoted expansions split on blanks, "${A[@]}" into its elements."""
        s = self.s
        words: list[list[str]] = [[]]
        quoted = [False]
        started = False
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\n;&|<>" or (stop and c in stop):
                break
            if c == "\\":
                if s[self.i + 1 : self.i + 2] == "\n":
                    self.i += 2
                    continue
                words[-1].append(s[self.i + 1 : self.i + 2])
                self.i += 2
                started = True
            elif c == "'":
                end = s.find("'", self.i + 1)
                end = len(s) if end < 0 else end
                words[-1].append(s[self.i + 1 : end])
                quoted[-1] = started = True
                self.i = end + 1
            elif c == '"':
                self.i += 1
                quoted[-1] = started = True
                while self.i < len(s) and s[self.i] != '"':
                    if s[self.i] == "\\" and s[self.i + 1 : self.i + 2] in ('"', "\\", "$", "`", "\n"):
                        if s[self.i + 1] != "\n":
                            words[-1].append(s[self.i + 1])
                        self.i += 2
                    elif s[self.i] == "$":
                        values, is_array = self._expansion()
                        if is_array and values is not None:
                            for n, v in enumerate(values):
                                if n:
                                    words.append([])
                                    quoted.append(True)
                                words[-1].append(v)
                            if not values:
                                words[-1].append("")
                        else:
                            words[-1].append(" ".join(values) if values is not None else self._raw)
                    else:
                        words[-1].append(s[self.i])
                        self.i += 1
                self.i += 1
            elif c == "$":
                values, _ = self._expansion()
                if values is None:
                    words[-1].append(self._raw)
                    started = True
                    continue
                split = [p for v in values for p in v.split()]  # unquoted: split into words
                if not split:
                    continue
                words[-1].append(split[0])
                for extra in split[1:]:
                    words.append([extra])
                    quoted.append(False)
                started = True
            elif c == "`":
                end = s.find("`", self.i + 1)
                end = len(s) if end < 0 else end
                words[-1].append(s[self.i : end + 1])
                self.i = end + 1
                started = True
            else:
                words[-1].append(c)
                self.i += 1
                started = True
        out = ["".join(w) for w, q in zip(words, quoted) if w or q]
        return out if (started or any(quoted)) else []

    def _expansion(self) -> tuple[list[str] | None, bool]:
        """At a '$': (the values, whether it was "${A[@]}"-like); None when it cannot be known (self._raw then
        holds the text as written)."""
        s, start = self.s, self.i
        self.i += 1
        if s.startswith("((", self.i):  # $((arithmetic))
            end = s.find("))", self.i)
            end = len(s) if end < 0 else end
            expr = s[self.i + 2 : end]
            self.i = end + 2
            value = self._arith(expr)
            self._raw = s[start : self.i]
            return ([str(value)] if value is not None else None), False
        if s.startswith("(", self.i):  # $(command substitution): unknown
            depth, j = 0, self.i
            while j < len(s):
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                j += 1
                if depth == 0:
                    break
            self.i = j
            self._raw = s[start:j]
            return None, False
        if s.startswith("{", self.i):
            end = s.find("}", self.i)
            end = len(s) if end < 0 else end
            inner = s[self.i + 1 : end]
            self.i = end + 1
            self._raw = s[start : self.i]
            return self._braced(inner)
        m = _NAME.match(s, self.i)
        if not m:
            if s[self.i : self.i + 1].isdigit() or s[self.i : self.i + 1] in "@*#?$!":  # positional / special
                self.i += 1
                self._raw = s[start : self.i]
                return None, False
            self._raw = "$"
            return None, False
        self.i = m.end()
        self._raw = s[start : self.i]
        value = self.script.variables.get(m.group())
        return ([value[0]] if value is not None else None), False

    def _braced(self, inner: str) -> tuple[list[str] | None, bool]:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([@*])\]", inner)
        if m:
            value = self.script.variables.get(m.group(1))
            return (list(value) if value is not None else None), m.group(2) == "@"
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]", inner)
        if m:
            value = self.script.variables.get(m.group(1))
            return ([str(len(value))] if value is not None else None), False
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=])(.*))?", inner, re.S)
        if not m:
            return None, False
        name, op, default = m.groups()
        value = self.script.variables.get(name)
        if value is not None and not (op and op.startswith(":") and value[0] == ""):
            return [value[0]], False
        if op is not None:
            expanded = self._expand_text(default)
            if op.endswith("="):
                self.script.variables[name] = [expanded]
            return [expanded], False
        return None, False

    def _expand_text(self, text: str) -> str:
        """A default value's own expansions ($VAR inside ${X:-$VAR})."""

        def sub(m: re.Match) -> str:
            value = self.script.variables.get(m.group(1) or m.group(2))
            return value[0] if value is not None else m.group()

        return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, text)

    def _arith(self, expr: str) -> int | None:
        """$((...)) over integers, + - * / % and the script's variables; None if it names anything unknown."""
        expr = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
        try:
            return _eval(ast.parse(expr.strip(), mode="eval").body, self.script.variables)
        except (SyntaxError, ValueError, KeyError, ZeroDivisionError):
            return None


_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _eval(node: ast.AST, variables: dict[str, list[str]]) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return int(variables[node.id][0])
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left, variables), _eval(node.right, variables))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, variables)
    raise ValueError("not arithmetic")


__all__ = ["Script", "run_script"]
