"""Choose the Python environment exatrain installs into, then install it there (editable, every extra).

Run by scripts/install.sh with the interpreter named by PYTHON, after that script has checked it is
Python >= 3.10.  Modes: no argument installs; ``--dry-run`` prints the decisions (one ``key: value``
line each) and changes nothing; ``--print-python`` prints only the interpreter the make targets run.

Decisions and why:

* environment: an interpreter that already runs in a virtual environment (PEP 405: ``sys.prefix``
  differs from ``sys.base_prefix``) or a conda environment (its prefix holds ``conda-meta/``, or
  ``CONDA_PREFIX`` names its prefix) is installed into as it is.  Any other interpreter gets a
  project-local virtual environment (``VENV``, default ``.venv``), because a distribution's own Python
  refuses ``pip install`` (PEP 668, "externally managed") and a user's base Python should stay as it was.
  The environment is made with ``--system-site-packages`` so a torch the base Python already has
  (a CUDA or ROCm build, say) is used, not installed a second time.  An existing VENV that runs on
  the same base Python is used as it is; only one this script made is ever removed and made again.
* pip in a new environment: ``venv`` installs it with ``ensurepip``; Debian and Ubuntu ship ensurepip
  separately (python3-venv), so without it the environment is made ``--without-pip`` and pip is
  brought in from the first source that has it: the base Python's own pip (seen through the system
  site-packages), a wheel downloaded by the base Python's pip, the distribution's pip wheel
  (/usr/share/python-wheels, package python3-pip-whl), or PyPI's JSON API (sha256-checked).
* torch: one that imports is kept (pinned by a constraint, so pip cannot swap it for another build);
  one that is installed but does not import, or is older than the trainer needs, is left alone and
  the install stops with one line saying so.  Only where no torch is installed at all is the CPU
  build ``torch==2.13.0`` installed: from the configured package sources when they have it (a local
  wheel directory, a mirror), else from PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu,
  as pytorch.org's install selector gives it; on Linux the ``+cpu`` local version is asked for so a
  multi-GB CUDA build can never be picked instead).
* versions: every package exatrain[all,dev] brings in besides torch is installed at the version
  ``constraints/exatrain.txt`` pins (pip's ``-c``), so CI and a user run the suite on the same
  versions; the CPU torch this script installs comes with ``constraints/torch-cpu.txt`` for its own
  dependencies (a kept torch never meets that file: its own pins may differ).  ``UPGRADE=1`` drops
  both files and asks pip for the newest versions pyproject.toml allows (``--upgrade
  --upgrade-strategy eager``), still keeping torch as above: the way to test against the newest.
* re-runs: a stamp (hash of pyproject.toml, these two scripts, the constraints files, the mode and the
  interpreter) skips pip when nothing it depends on changed and exatrain still imports from this
  checkout's src/; the install is editable, so source edits need no reinstall.  ``UPGRADE=1`` always
  runs pip (the newest versions move), and the next pinned install puts the pins back.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAMP = REPO / ".install-stamp"
EXTRAS = "all,dev"
TORCH_PIN = "2.13.0"
TORCH_MIN = (2, 6)  # pyproject.toml's `train` extra: torch>=2.6
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIP_JSON = "https://pypi.org/pypi/pip/json"  # PyPI JSON API: docs.pypi.org/api/json/
DISTRO_WHEELS = "/usr/share/python-wheels"  # Debian/Ubuntu python3-pip-whl
MARKER = "made-by-exatrain-install"  # inside a VENV this script made (and so may make again)
CONSTRAINTS = REPO / "constraints" / "exatrain.txt"  # what exatrain[all,dev] brings in, torch aside
TORCH_CONSTRAINTS = REPO / "constraints" / "torch-cpu.txt"  # what the pinned CPU torch brings in beside it

# Runs inside a candidate interpreter: is torch importable, and does pip see it installed?
TORCH_PROBE = r"""
import json
out = {"version": None, "dist": None, "error": None, "path": None}
try:
    from importlib.metadata import version
    out["dist"] = version("torch")
except Exception:
    pass
try:
    import torch
    out["version"] = str(torch.__version__)
    out["path"] = str(getattr(torch, "__file__", None))
except Exception as exc:  # a broken build counts as "installed, does not import"
    out["error"] = type(exc).__name__ + ": " + str(exc).splitlines()[0] if str(exc) else type(exc).__name__
print(json.dumps(out))
"""

ENV_PROBE = r"""
import json, os, sys
print(json.dumps({"prefix": sys.prefix, "base_prefix": sys.base_prefix, "executable": sys.executable,
                  "version": "%d.%d.%d" % sys.version_info[:3]}))
"""


class Stop(Exception):
    """Something the user has to fix: one line on stderr, exit status 2."""


def say(msg: str) -> None:
    print(f"install: {msg}", flush=True)


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(kw.pop("env", {}))
    return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, **kw)


def pip_step(argv: list[str], what: str) -> None:
    """Run one pip command; when it fails, pip has said why: add which step it was and stop with its status."""
    p = run(argv)
    if p.returncode != 0:
        print(f"install: {what} failed (pip exited {p.returncode}; its messages are above)", file=sys.stderr)
        raise SystemExit(p.returncode)


def probe(python: str, code: str, *flags: str) -> dict | None:
    """The JSON `code` prints when run by `python` (None: it does not run, or prints no JSON)."""
    try:
        p = run([python, *flags, "-c", code], capture_output=True, text=True)
    except OSError:
        return None
    if p.returncode != 0:
        return None
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def upgrade_mode() -> bool:
    """UPGRADE=1: the newest versions pyproject.toml allows instead of the pinned ones (UPGRADE unset, empty or 0)."""
    value = os.environ.get("UPGRADE", "").strip()
    if value not in ("", "0", "1"):
        raise Stop(
            f"UPGRADE={value!r}: use UPGRADE=1 (the newest versions pyproject.toml allows) or leave it unset "
            f"(the versions {CONSTRAINTS.relative_to(REPO)} pins)"
        )
    return value == "1"


def version_flags(upgrade: bool, *files: Path) -> list[str]:
    """pip's flags for the versions: ``-c`` each constraints file, or the eager upgrade of UPGRADE=1."""
    if upgrade:
        return ["--upgrade", "--upgrade-strategy", "eager"]
    for f in files:
        if not f.is_file():
            raise Stop(f"{f} is missing: restore it (git checkout -- {f.relative_to(REPO)}) or install with UPGRADE=1")
    return [arg for f in files for arg in ("-c", str(f))]


def same_path(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


# ---------------------------------------------------------------- where to install


def current_kind() -> str:
    """'venv', 'conda' or 'plain' for the interpreter running this script."""
    if sys.prefix != sys.base_prefix or hasattr(sys, "real_prefix"):
        return "venv"
    conda = os.environ.get("CONDA_PREFIX")
    if (Path(sys.prefix) / "conda-meta").is_dir() or (conda and same_path(conda, sys.prefix)):
        return "conda"
    return "plain"


def venv_dir() -> Path:
    v = Path(os.environ.get("VENV") or ".venv").expanduser()
    return v if v.is_absolute() else REPO / v


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def venv_state(venv: Path) -> tuple[str, str]:
    """('absent' | 'reuse' | 'remake', why) for VENV; Stop for one this script must not touch.

    Only an environment this script made (it leaves MARKER inside) is ever removed and made again;
    one a user made is used as it is when it runs on the same base Python, else left alone.
    """
    if not venv.exists():
        return "absent", ""
    if not (venv / "pyvenv.cfg").is_file():
        raise Stop(
            f"{venv} exists and is not a virtual environment (no pyvenv.cfg): move it away or set VENV=another/dir"
        )
    ours = (venv / MARKER).is_file()
    info = probe(str(venv_python(venv)), ENV_PROBE)
    if info is None:
        why = "its python does not run"
    elif not same_path(info["base_prefix"], sys.base_prefix):
        why = f"it was made from the Python at {info['base_prefix']}, not {sys.base_prefix}"
    else:
        return "reuse", "" if ours else "made elsewhere, used as it is"
    if ours:
        return "remake", why
    raise Stop(f"{venv} cannot be used ({why}) and install did not make it: remove it or set VENV=another/dir")


class Target:
    """The environment to install into and how it comes to exist."""

    def __init__(self) -> None:
        self.kind = current_kind()
        self.venv = venv_dir()
        if self.kind in ("venv", "conda"):
            self.python = sys.executable
            self.prefix = sys.prefix
            self.state, self.why = "current", ""
        else:
            self.python = str(venv_python(self.venv))
            self.prefix = str(self.venv)
            self.state, self.why = venv_state(self.venv)

    @property
    def makes_venv(self) -> bool:
        return self.kind == "plain" and self.state != "reuse"

    def describe(self) -> str:
        if self.kind != "plain":
            return f"current {self.kind} {self.prefix} (installed into as it is)"
        why = f" ({self.why})" if self.why else ""
        if self.state == "reuse":
            return f"reuse venv {self.venv}{why}"
        label = {"absent": "new", "remake": "remake"}[self.state]
        return f"{label} venv {self.venv}{why}, --system-site-packages of {sys.executable}"

    def where_line(self) -> str:
        if self.kind != "plain":
            return f"exatrain is installed in the current {self.kind} environment {self.prefix}"
        try:
            shown = str(self.venv.relative_to(Path.cwd()))
        except ValueError:
            shown = str(self.venv)
        act = "Scripts\\activate" if os.name == "nt" else "bin/activate"
        return (
            f"exatrain is installed in the virtual environment {self.venv}: "
            f"run `. {shown}/{act}` to call `exatrain` directly"
        )


# ---------------------------------------------------------------- pip for a new environment


def has_ensurepip() -> bool:
    # version() reads the bundled pip wheel's version: an empty `ensurepip` directory would import.
    p = run([sys.executable, "-c", "import ensurepip; ensurepip.version()"], capture_output=True)
    return p.returncode == 0


def has_pip(python: str) -> bool:
    try:
        return run([python, "-m", "pip", "--version"], capture_output=True).returncode == 0
    except OSError:
        return False


def host_pip(no_user_site: bool) -> bool:
    flags = ["-s"] if no_user_site else []
    p = run([sys.executable, *flags, "-m", "pip", "--version"], capture_output=True)
    return p.returncode == 0


def distro_pip_wheel() -> str | None:
    wheels = sorted(glob.glob(os.path.join(DISTRO_WHEELS, "pip-*.whl")))
    return wheels[-1] if wheels else None


def pip_route() -> str:
    """Where a venv made --without-pip gets its pip (the first source that exists)."""
    if host_pip(no_user_site=True):
        return "host-pip"
    if host_pip(no_user_site=False):
        return "host-download"
    if distro_pip_wheel():
        return "distro-wheel"
    return "pypi"


def pip_from_pypi(dest: Path) -> Path:
    """The newest pip wheel from PyPI's JSON API, its sha256 checked against the index's digest."""
    try:
        with urllib.request.urlopen(PIP_JSON, timeout=60) as r:
            meta = json.load(r)
        files = [f for f in meta["urls"] if f["filename"].endswith("-py3-none-any.whl")]
        if not files:
            raise Stop(f"PyPI lists no pure-Python pip wheel at {PIP_JSON}")
        f = files[0]
        url = urllib.parse.urljoin(PIP_JSON, f["url"])  # a mirror may answer with relative links
        with urllib.request.urlopen(url, timeout=120) as r:
            data = r.read()
    except (OSError, ValueError, KeyError) as exc:
        raise Stop(
            f"{sys.executable} has no ensurepip and no pip, no local pip wheel was found, and PyPI "
            f"was not reachable ({exc}): install python3-venv (Debian/Ubuntu: apt install "
            f"python3-venv) or set PYTHON to a Python that has venv and pip"
        ) from None
    if hashlib.sha256(data).hexdigest() != f["digests"]["sha256"]:
        raise Stop(f"the pip wheel downloaded from PyPI does not match its published sha256 ({url})")
    out = dest / f["filename"]
    out.write_bytes(data)
    return out


def bootstrap_pip(python: str) -> None:
    """Give a venv made --without-pip a pip of its own."""
    route = pip_route()
    if route == "host-pip":
        say("no ensurepip: installing pip into the environment with the base Python's pip")
        if run([python, "-m", "pip", "install", "-q", "--ignore-installed", "--no-deps", "pip"]).returncode == 0:
            return
        say("could not install a pip of its own; the base Python's pip (seen through the system site-packages) is used")
        return
    with tempfile.TemporaryDirectory() as tmp:
        wheel: Path | None = None
        if route == "host-download":
            say("no ensurepip: downloading the pip wheel with the base Python's pip")
            p = run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--dest",
                    tmp,
                    "pip",
                ]
            )
            found = sorted(Path(tmp).glob("pip-*.whl"))
            wheel = found[-1] if p.returncode == 0 and found else None
        if wheel is None and distro_pip_wheel():
            wheel = Path(distro_pip_wheel())
            say(f"no ensurepip: installing pip from {wheel}")
        if wheel is None:
            say(f"no ensurepip: fetching the pip wheel from PyPI ({PIP_JSON})")
            wheel = pip_from_pypi(Path(tmp))
        # pip runs from its own wheel (the way CPython's ensurepip runs it) to install that wheel.
        pip_step(
            [python, str(wheel / "pip"), "install", "-q", "--ignore-installed", "--no-index", "--no-deps", str(wheel)],
            f"installing pip from {wheel.name}",
        )


def make_venv(target: Target) -> None:
    venv = target.venv
    if target.state == "remake":
        say(f"remaking {venv}: {target.why}")
        shutil.rmtree(venv)
    if has_ensurepip():
        say(f"making the virtual environment {venv} (--system-site-packages)")
        if run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)]).returncode == 0:
            (venv / MARKER).write_text("scripts/install_env.py made this environment and may remake it\n")
            return
        say("venv with pip failed; making it without pip instead")
        shutil.rmtree(venv, ignore_errors=True)
    else:
        say(
            f"making the virtual environment {venv} (--system-site-packages, --without-pip: "
            f"{sys.executable} has no ensurepip)"
        )
    p = run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        raise Stop(
            f"{sys.executable} cannot make a virtual environment ({(p.stderr or p.stdout).strip()[:200]}): "
            f"install python3-venv (Debian/Ubuntu: apt install python3-venv) or set PYTHON to a "
            f"Python that has venv"
        )
    (venv / MARKER).write_text("scripts/install_env.py made this environment and may remake it\n")
    bootstrap_pip(target.python)


# ---------------------------------------------------------------- torch


def version_tuple(v: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: "2.13.0+cpu" -> (2, 13, 0), "2.6.0a0+git" -> (2, 6, 0)."""
    m = re.match(r"\d+(?:\.\d+)*", v)
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def torch_spec() -> str:
    # Linux wheels on PyPI are CUDA builds; the CPU index spells its Linux builds with "+cpu".
    return f"torch=={TORCH_PIN}+cpu" if platform.system() == "Linux" else f"torch=={TORCH_PIN}"


def torch_decision(python: str, *flags: str) -> tuple[str, str]:
    """('keep', dist version) or ('install', spec); Stop when a torch is there but cannot be used."""
    t = probe(python, TORCH_PROBE, *flags)
    if t is None:
        raise Stop(f"{python} could not be asked about torch")
    if t["version"] is not None:
        if t["dist"] is None:
            raise Stop(
                f"torch {t['version']} imports from {t['path']} but pip does not see it installed, so "
                f"pip would add a second torch: install exatrain yourself there "
                f"(pip install --no-deps -e .) or use a Python whose torch pip installed"
            )
        if version_tuple(t["version"]) < TORCH_MIN:
            raise Stop(
                f"torch {t['version']} is installed but exatrain's trainer needs torch>="
                f"{'.'.join(map(str, TORCH_MIN))}; install keeps the torch it finds: upgrade it yourself "
                f"or set PYTHON to another Python"
            )
        return "keep", t["dist"]
    if t["dist"] is not None:
        raise Stop(
            f"torch {t['dist']} is installed but does not import ({t['error']}); install does not replace "
            f"it: repair it (or uninstall it to get the CPU build {TORCH_PIN})"
        )
    return "install", torch_spec()


def install_torch(python: str, spec: str, upgrade: bool) -> None:
    """The pinned CPU build from the configured package sources first (a local wheel directory or a
    mirror that has it: no other host is asked); only where they lack it, PyTorch's CPU index. Its
    dependencies at the pinned versions (or, with UPGRADE=1, the newest)."""
    say(f"no torch installed: installing the CPU build {spec}")
    versions = [] if upgrade else version_flags(False, CONSTRAINTS, TORCH_CONSTRAINTS)
    first = subprocess.run([python, "-m", "pip", "install", "-q", *versions, spec], stdin=subprocess.DEVNULL)
    if first.returncode == 0:
        return
    index = os.environ.get("TORCH_INDEX_URL", TORCH_CPU_INDEX)
    if not index:
        raise Stop(f"installing {spec} failed and TORCH_INDEX_URL is empty: install torch yourself, then re-run")
    say(f"{spec} is not in the configured package sources: trying {index}")
    pip_step([python, "-m", "pip", "install", *versions, spec, "--extra-index-url", index], f"installing {spec}")


# ---------------------------------------------------------------- stamp


def stamp_key(python: str) -> str:
    """What a pinned install depends on: pyproject.toml, the install scripts, the constraints files and
    the interpreter (an UPGRADE=1 install leaves no stamp: it always runs)."""
    h = hashlib.sha256()
    for f in (
        REPO / "pyproject.toml",
        REPO / "scripts" / "install.sh",
        Path(__file__).resolve(),
        CONSTRAINTS,
        TORCH_CONSTRAINTS,
    ):
        h.update(f.read_bytes() if f.is_file() else b"(missing)")
    h.update(os.path.abspath(python).encode())
    return h.hexdigest()


def editable_here(python: str) -> bool:
    """Does `python` import exatrain from this checkout's src/ (without help from PYTHONPATH)?"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('exatrain').origin)"],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if p.returncode != 0 or not p.stdout.strip():
        return False
    return Path(p.stdout.strip()).resolve().is_relative_to((REPO / "src").resolve())


def up_to_date(target: Target, upgrade: bool = False) -> bool:
    if upgrade or target.makes_venv or not STAMP.is_file() or not Path(target.python).exists():
        return False
    return STAMP.read_text(encoding="utf-8").strip() == stamp_key(target.python) and editable_here(target.python)


# ---------------------------------------------------------------- modes


def pip_install_argv(python: str, torch_pin: Path, upgrade: bool) -> list[str]:
    """The pip command that installs exatrain[all,dev] editable, torch held at ``torch_pin``'s version."""
    return [
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "-c",
        str(torch_pin),
        *version_flags(upgrade, CONSTRAINTS),
        "-e",
        f"{REPO}[{EXTRAS}]",
    ]


def dry_run(target: Target) -> None:
    upgrade = upgrade_mode()
    print(f"python: {sys.executable} ({platform.python_version()})")
    print(f"environment: {target.describe()}")
    if target.makes_venv:
        if has_ensurepip():
            print("pip: ensurepip")
        else:
            print(f"pip: --without-pip, then pip from {pip_route()}")
        # The new venv sees the base Python's site-packages but not its user site (-s).
        action, what = torch_decision(sys.executable, "-s")
    else:
        print(
            "pip: in the environment"
            if has_pip(target.python)
            else "pip: missing (the install stops and says how to add it)"
        )
        action, what = torch_decision(target.python)
    print(f"torch: keep {what}" if action == "keep" else f"torch: install {what}")
    if upgrade:
        print("versions: the newest pyproject.toml allows (UPGRADE=1), torch as above")
    else:
        version_flags(False, CONSTRAINTS, TORCH_CONSTRAINTS)
        pinned = CONSTRAINTS.relative_to(REPO)
        print(f"versions: {pinned}" + (f" and {TORCH_CONSTRAINTS.relative_to(REPO)}" if action == "install" else ""))
    flags = " --upgrade --upgrade-strategy eager" if upgrade else f" -c {CONSTRAINTS.relative_to(REPO)}"
    state = "up to date" if up_to_date(target, upgrade) else f"pip install{flags} -e {REPO}[{EXTRAS}]"
    print(f"install: {state}")
    print(f"runs: {target.python}")


def install(target: Target) -> None:
    upgrade = upgrade_mode()
    version_flags(upgrade, CONSTRAINTS, TORCH_CONSTRAINTS)  # a missing constraints file stops here, before any work
    if up_to_date(target, upgrade):
        say("up to date (pyproject.toml, the install scripts and the constraints unchanged since the last install)")
        say(target.where_line())
        return
    if target.makes_venv:
        make_venv(target)
    elif not has_pip(target.python):
        if target.kind == "plain" and (target.venv / MARKER).is_file():
            bootstrap_pip(target.python)  # an earlier install made this venv and stopped before pip
        else:
            raise Stop(
                f"the environment {target.prefix} has no pip: run `{target.python} -m ensurepip` "
                f"(or install pip there), then make install again"
            )
    action, what = torch_decision(target.python)
    if action == "install":
        install_torch(target.python, what, upgrade)
        action, what = torch_decision(target.python)
        if action != "keep":
            raise Stop(f"torch still does not import after installing {torch_spec()}")
    else:
        say(f"keeping the installed torch {what}")
    STAMP.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "torch.txt"
        constraints.write_text(f"torch=={what}\n", encoding="utf-8")
        how = (
            "the newest versions pyproject.toml allows (UPGRADE=1)"
            if upgrade
            else f"the versions {CONSTRAINTS.relative_to(REPO)} pins"
        )
        say(f"pip install -e .[{EXTRAS}] into {target.prefix}, {how}")
        pip_step(pip_install_argv(target.python, constraints, upgrade), f"installing exatrain[{EXTRAS}]")
    if not editable_here(target.python):
        raise Stop(f"after installing, {target.python} does not import exatrain from {REPO / 'src'}")
    if not upgrade:
        STAMP.write_text(stamp_key(target.python) + "\n", encoding="utf-8")
    say(target.where_line())


def main(argv: list[str]) -> int:
    modes = {"--dry-run", "--print-python"}
    if len(argv) > 1 or (argv and argv[0] not in modes):
        print(f"install: unknown arguments {' '.join(argv)} (use --dry-run or --print-python)", file=sys.stderr)
        return 2
    try:
        target = Target()
        if argv == ["--print-python"]:
            print(target.python)
        elif argv == ["--dry-run"]:
            dry_run(target)
        else:
            install(target)
    except Stop as exc:
        print(f"install: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
