#!/usr/bin/env python3
"""Feed every ``export-config`` export of the plan matrix through the engines' own code and compare the model
each engine builds with the plan's.

For each plan of ``exatrain.engine_configs.matrix`` and each target, the export is rendered (by this tree, or by
the tree ``--exatrain-src`` names), then, in a virtual environment of that engine's own:

* Megatron-LM (``--megatron-lm``, a checkout or a git URL; default commit d98e8a64): ``parse_args`` +
  ``validate_args`` on the exported flags at the plan's world size, the TransformerConfig built from them
  (``core_transformer_config_from_args``), and the GPT model of Megatron-LM's ``gpt_builders.gpt_builder`` on the
  meta device, whole (tp = pp = ep = 1), with the local layer spec;
* Megatron-DeepSpeed (``--megatron-deepspeed``; default commit 4efb479d) with DeepSpeed 0.19.8: its
  ``parse_args`` + ``validate_args``, DeepSpeed's ``DeepSpeedConfig`` on the exported JSON at the plan's
  data-parallel size, and its GPTModel on the meta device, whole;
* torchtitan v0.2.2: its ConfigManager on the TOML (``--job.config_file``), the flavor the export names (or
  registers), built on the meta device, ParallelDims and the device mesh at the plan's world size (a fake
  process group), the batch arithmetic of its train.py and the pipeline's module names;
* torchtitan 0.3.0: its ConfigManager on the exported command line, the model of the config function built on
  the meta device, and the same layout and batch checks.

A plan passes an engine when the engine accepts the export and builds the plan's parameter count (a router's
per-expert balancing bias, a buffer in Megatron-Core and torchtitan, counted where the plan's model has one);
an export exatrain refuses (one line, exit 2) is reported as refused. The engines are pip-installed into
venvs under ``--venvs`` (never into this environment); with ``--reuse-torch`` (the default when this
interpreter has torch) they see this interpreter's packages through a .pth file and a constraint pins torch,
so pip installs nothing that replaces it. The engines' sources are cloned into ``--venvs``, never into this
repository.

Usage (the Megatron sources are the user's: a checkout, a git URL, or URL@commit):
    python scripts/check_exports.py --megatron-lm https://github.com/NVIDIA/Megatron-LM.git \\
        --megatron-deepspeed https://github.com/deepspeedai/Megatron-DeepSpeed.git [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBES = Path(__file__).resolve().parent / "export_probes"
TRITON = "triton==3.9.0"  # Megatron-LM's core and torchtitan 0.3 import it at module level


@dataclass(frozen=True)
class Engine:
    """One engine of the check: the export target it reads, what pip installs, its probe, the source it needs."""

    name: str
    label: str
    target: str
    pip: tuple[str, ...]
    probe: str
    source: str = ""  # "megatron-lm" / "megatron-deepspeed": a checkout the user supplies
    default_commit: str = ""
    build_isolation: bool = True
    extra_pip: tuple[str, ...] = field(default=())


ENGINES = (
    Engine(
        "megatron-lm",
        "Megatron-LM",
        "megatron",
        ("numpy", "packaging>=24.2", "typing_extensions", TRITON),
        "probe_megatron_lm.py",
        source="megatron-lm",
        default_commit="d98e8a64",
    ),
    Engine(
        "megatron-deepspeed",
        "Megatron-DeepSpeed + DeepSpeed 0.19.8",
        "deepspeed",
        ("deepspeed==0.19.8",),
        "probe_megatron_deepspeed.py",
        source="megatron-deepspeed",
        default_commit="4efb479d",
        build_isolation=False,
        extra_pip=("wheel", "setuptools"),
    ),
    Engine("torchtitan-0.2.2", "torchtitan 0.2.2", "torchtitan", ("torchtitan==0.2.2", TRITON), "probe_torchtitan.py"),
    # torchao: the float8 converter of the config functions that carry one (llama3_405b)
    Engine(
        "torchtitan-0.3.0",
        "torchtitan 0.3.0",
        "torchtitan-0.3",
        ("torchtitan==0.3.0", TRITON, "torchao"),
        "probe_torchtitan.py",
    ),
)
DEFAULT_SOURCES = {
    "megatron-lm": "https://github.com/NVIDIA/Megatron-LM.git",
    "megatron-deepspeed": "https://github.com/deepspeedai/Megatron-DeepSpeed.git",
}


def fail(message: str) -> None:
    sys.stderr.write(f"check_exports: {message}\n")
    raise SystemExit(2)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, text=True, **kw)


# ---- 1. the exports --------------------------------------------------------------------------------------------
RENDER = textwrap.dedent("""
    import json, sys
    from exatrain.engine_configs import export
    from exatrain.errors import UserError
    from exatrain.plan import Plan
    jobs = json.loads(sys.argv[1])
    out = {}
    for name, plan_file, target, path in jobs:
        try:
            result = export(Plan.load(plan_file), target)
        except UserError as exc:
            out[name + "|" + target] = {"refused": str(exc)}
            continue
        open(path, "w").write(result.text)
        files = {}
        for fname, content in result.files:
            fpath = path + "." + fname
            open(fpath, "w").write(content)
            files[fname] = fpath
        out[name + "|" + target] = {"path": path, "files": files, "notes": list(result.notes)}
    print(json.dumps(out))
""")


def bash_array(path: str, array: str, files: dict[str, str]) -> list[str]:
    """The words of ``array`` after bash sources the export, with the export's side files in its folder."""
    folder = tempfile.mkdtemp(prefix="exatrain-export-")
    for name, src in files.items():
        Path(folder, name).write_text(Path(src).read_text())
    out = run(
        ["bash", "-c", f'set -eu; source "$1" >/dev/null; printf "%s\\n" "${{{array}[@]}}"', "x", path],
        cwd=folder,
        capture_output=True,
        check=True,
    )
    return out.stdout.splitlines()


def render(plans: dict, work: Path, exatrain_src: Path) -> dict:
    """The manifest: per plan, what exatrain plans and every target's export (argv, files, or a refusal)."""
    from exatrain.accounting.params import total_params

    jobs, manifest = [], {}
    for name, plan in plans.items():
        plan_file = work / f"{name}.plan.json"
        plan.save(plan_file)
        m = plan.model
        manifest[name] = {
            "gpus": plan.gpus,
            "tp": plan.tp,
            "pp": plan.pp,
            "cp": plan.cp,
            "dp": plan.dp,
            "ep": plan.ep,
            "micro_batch": plan.micro_batch,
            "global_batch": plan.global_batch,
            "num_microbatches": plan.num_microbatches,
            "interleave": plan.interleave,
            "layers_per_stage": list(plan.layers_per_stage()),
            "layers": m.layers,
            "vocab": m.vocab,
            "seq_len": m.seq_len,
            "params": total_params(m),
            "router_bias": m.moe_layers * m.experts if m.router_bias else 0,
            "windowed_layers": m.windowed_layers,
            "sliding_window": m.sliding_window,
            "exports": {},
        }
        for engine in ENGINES:
            jobs.append((name, str(plan_file), engine.target, str(work / f"{name}.{engine.target}")))
    env = {**os.environ, "PYTHONPATH": str(exatrain_src)}
    out = run([sys.executable, "-c", RENDER, json.dumps(jobs)], capture_output=True, env=env)
    if out.returncode:
        fail(f"rendering the exports with {exatrain_src} failed:\n{out.stderr[-2000:]}")
    rendered = json.loads(out.stdout)
    for name, _, target, _ in jobs:
        got = rendered[f"{name}|{target}"]
        entry = dict(got)
        if "path" in got:
            text = Path(got["path"]).read_text()
            array = {
                "megatron": "MEGATRON_ARGS",
                "deepspeed": "MEGATRON_DEEPSPEED_ARGS",
                "torchtitan-0.3": "TORCHTITAN_ARGS",
            }.get(target)
            if array:
                entry["argv"] = bash_array(got["path"], array, got["files"])
            entry["env"] = (
                {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in text) else {}
            )
            lines = text.splitlines()  # the v0.2.2 flavor to register: the line after the header says so
            entry["register"] = [
                lines[i + 1][1:].strip() for i, line in enumerate(lines[:-1]) if line.startswith("# Register the model")
            ]
        manifest[name]["exports"][target] = entry
    return manifest


# ---- 2. the engines' environments -------------------------------------------------------------------------------
def purelib(python: str) -> tuple[str, str | None]:
    """(site-packages of ``python``, its torch version or None)."""
    out = run(
        [
            python,
            "-c",
            "import sysconfig, importlib.util as u\n"
            "print(sysconfig.get_paths()['purelib'])\n"
            "print(__import__('torch').__version__ if u.find_spec('torch') else '')",
        ],
        capture_output=True,
        check=True,
    ).stdout.splitlines()
    return out[0], (out[1] or None)


def ensure_venv(engine: Engine, root: Path, python: str, reuse_torch: bool) -> Path:
    """The engine's venv (made once; a marker file records what it holds)."""
    path = root / engine.name
    py = path / "bin" / "python"
    want = {"pip": list(engine.extra_pip + engine.pip), "python": python, "reuse_torch": reuse_torch}
    marker = path / "exatrain-engine.json"
    if py.exists() and marker.exists() and json.loads(marker.read_text()) == want:
        return py
    print(f"check_exports: making {path} ({' '.join(engine.pip)})", flush=True)
    run([python, "-m", "venv", "--clear", *(["--system-site-packages"] if reuse_torch else []), str(path)], check=True)
    constraint: list[str] = []
    if reuse_torch:
        site, torch_version = purelib(python)
        own_site, _ = purelib(str(py))
        # appended after the venv's own site-packages: what pip installs here wins, torch comes from `python`
        Path(own_site, "zz_exatrain_shared.pth").write_text(site + "\n")
        if torch_version:
            (path / "constraints.txt").write_text(f"torch=={torch_version}\n")
            constraint = ["-c", str(path / "constraints.txt")]
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *constraint]
    for step in ([list(engine.extra_pip)] if engine.extra_pip else []) + [
        ([] if engine.build_isolation else ["--no-build-isolation"]) + list(engine.pip)
    ]:
        if run(pip + step).returncode:
            fail(f"pip could not install {' '.join(step)} into {path} (its output is above)")
    marker.write_text(json.dumps(want))
    return py


def ensure_source(spec: str, root: Path, name: str, default_commit: str) -> tuple[Path, str]:
    """(a checkout of ``spec``, its commit): a folder that holds the sources is used as it is; a git URL or
    repository (optionally URL@commit) is cloned under ``root`` and checked out at the commit."""
    local = Path(spec)
    if local.is_dir() and (local / "megatron").is_dir():
        rev = run(["git", "-C", str(local), "rev-parse", "HEAD"], capture_output=True)
        return local, rev.stdout.strip() if rev.returncode == 0 else "(not a git checkout)"
    url, _, commit = spec.rpartition("@") if "@" in spec and not spec.startswith("git@") else (spec, "", "")
    url, commit = (url or spec), (commit or default_commit)
    dest = root / "src" / name
    try:
        if not (dest / ".git").exists():
            print(f"check_exports: cloning {url} into {dest}", flush=True)
            run(["git", "clone", "--quiet", url, str(dest)], check=True, capture_output=True)
        run(["git", "-C", str(dest), "checkout", "--quiet", commit], check=True, capture_output=True)
        rev = run(["git", "-C", str(dest), "rev-parse", "HEAD"], capture_output=True, check=True).stdout.strip()
    except subprocess.CalledProcessError as exc:
        last = ((exc.stderr or "").strip().splitlines() or ["?"])[-1]
        fail(
            f"{name} sources from {spec}: git {exc.cmd[1] if exc.cmd[1] != '-C' else exc.cmd[3]} failed ({last}); "
            f"pass --{name} PATH (a checkout) or URL@COMMIT"
        )
    return dest, rev


def engine_version(py: Path, engine: Engine) -> str:
    module = {
        "megatron-deepspeed": "deepspeed",
        "torchtitan-0.2.2": "torchtitan",
        "torchtitan-0.3.0": "torchtitan",
    }.get(engine.name)
    if not module:
        return ""
    out = run(
        [str(py), "-c", f"from importlib.metadata import version; print(version('{module}'))"], capture_output=True
    )
    return out.stdout.strip()


# ---- 3. the comparison ------------------------------------------------------------------------------------------
def verdict(plan: dict, export: dict, result: dict | None) -> tuple[str, str]:
    """(status, detail): pass | refused | FAIL."""
    if "refused" in export:
        return "refused", export["refused"]
    if result is None:
        return "FAIL", "the probe gave no result"
    if not result.get("accepted"):
        return "FAIL", f"rejected: {result.get('error', '?')}"
    if result.get("error"):
        return "FAIL", f"accepted, but the model's build failed: {result['error']}"
    built = result["params"] + (result.get("bias_buffers", 0) if plan["router_bias"] else 0)
    problems = list(result.get("problems", []))
    if built != plan["params"]:
        problems.insert(0, f"built {built:,} parameters, planned {plan['params']:,}")
    if problems:
        return "FAIL", "; ".join(problems)
    return "pass", f"{built:,} parameters"


def markdown(
    rows: list[tuple[str, dict[str, tuple[str, str]]]],
    engines: list[Engine],
    versions: dict[str, str],
    command: str,
    started: str,
) -> str:
    head = ["| plan | " + " | ".join(versions[e.name] for e in engines) + " |", "|---|" + "---|" * len(engines)]
    body = []
    for plan, cells in rows:
        shown = []
        for e in engines:
            status, detail = cells[e.name]
            shown.append(
                f"pass ({detail})"
                if status == "pass"
                else "refused by exatrain"
                if status == "refused"
                else f"**FAIL**: {detail}"
            )
        body.append(f"| {plan} | " + " | ".join(shown) + " |")
    return "\n".join(
        [
            f"## Exports through the engines' own code — {started}",
            "",
            f"Command: `{command}`",
            "",
            f"Machine: {platform.machine()} CPU, Python {platform.python_version()}; the engines on the "
            "meta device, in their own venvs.",
            "",
            *head,
            *body,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--megatron-lm",
        metavar="PATH|URL[@COMMIT]",
        help=f"Megatron-LM's sources (default {DEFAULT_SOURCES['megatron-lm']}@d98e8a64)",
    )
    ap.add_argument(
        "--megatron-deepspeed",
        metavar="PATH|URL[@COMMIT]",
        help=f"Megatron-DeepSpeed's sources (default {DEFAULT_SOURCES['megatron-deepspeed']}@4efb479d)",
    )
    ap.add_argument(
        "--engines",
        default=",".join(e.name for e in ENGINES),
        help="comma-separated subset of " + ", ".join(e.name for e in ENGINES),
    )
    ap.add_argument("--plans", default="", help="comma-separated subset of the matrix's plans (default all)")
    ap.add_argument(
        "--venvs",
        default=str(Path.home() / ".cache" / "exatrain" / "engines"),
        metavar="DIR",
        help="where the engines' venvs and sources go (default ~/.cache/exatrain/engines)",
    )
    ap.add_argument("--python", default=sys.executable, help="the interpreter the venvs are made from")
    ap.add_argument(
        "--reuse-torch",
        choices=("auto", "yes", "no"),
        default="auto",
        help="let the venvs see --python's packages (its torch) instead of installing torch (default: "
        "yes when --python has torch)",
    )
    ap.add_argument(
        "--exatrain-src",
        default=str(ROOT / "src"),
        metavar="DIR",
        help="the exatrain tree whose export-config renders the exports (default this one's)",
    )
    ap.add_argument("--json", metavar="OUT", help="write every result here")
    ap.add_argument("--markdown", metavar="OUT", help="write the results as a RESULTS.md section here")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT / "src"))
    from exatrain.engine_configs.matrix import matrix

    engines = [e for e in ENGINES if e.name in args.engines.split(",")]
    if len(engines) != len(args.engines.split(",")):
        fail(f"--engines {args.engines}: choose from {', '.join(e.name for e in ENGINES)}")
    plans = matrix()
    if args.plans:
        unknown = set(args.plans.split(",")) - set(plans)
        if unknown:
            fail(f"--plans: unknown plan(s) {', '.join(sorted(unknown))}; the matrix has {', '.join(plans)}")
        plans = {n: p for n, p in plans.items() if n in args.plans.split(",")}
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    root = Path(args.venvs).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="exatrain-exports-"))
    manifest = render(plans, work, Path(args.exatrain_src).resolve())
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
    has_torch = purelib(args.python)[1] is not None
    reuse = args.reuse_torch == "yes" or (args.reuse_torch == "auto" and has_torch)

    results: dict[str, dict] = {}
    versions: dict[str, str] = {}
    sources = {}
    for engine in engines:  # the sources first: a wrong path or URL fails before any install
        if engine.source:
            spec = (
                getattr(args, engine.source.replace("-", "_"))
                or f"{DEFAULT_SOURCES[engine.source]}@{engine.default_commit}"
            )
            sources[engine.name] = ensure_source(spec, root, engine.source, engine.default_commit)
    for engine in engines:
        py = ensure_venv(engine, root, args.python, reuse)
        cmd = [
            str(py),
            str(PROBES / engine.probe),
            "--manifest",
            str(work / "manifest.json"),
            "--target",
            engine.target,
            "--out",
            str(work / f"{engine.name}.json"),
        ]
        label = engine.label
        if engine.source:
            src, rev = sources[engine.name]
            cmd += ["--source", str(src)]
            label = f"{engine.label.split(' + ')[0]} {rev[:8]}" + (
                f" + DeepSpeed {engine_version(py, engine)}" if engine.name == "megatron-deepspeed" else ""
            )
        else:
            label = f"torchtitan {engine_version(py, engine)}"
        versions[engine.name] = label
        print(f"check_exports: {label}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
        out = run(cmd, capture_output=True)
        log = work / f"{engine.name}.log"
        log.write_text(out.stdout + out.stderr)
        path = work / f"{engine.name}.json"
        if not path.exists():
            fail(
                f"the {engine.name} probe wrote no results (exit {out.returncode}); its log: {log}\n"
                f"{out.stderr[-3000:]}"
            )
        results[engine.name] = json.loads(path.read_text())

    rows = []
    failed = 0
    for name, plan in manifest.items():
        cells = {}
        for engine in engines:
            export = plan["exports"][engine.target]
            cells[engine.name] = verdict(plan, export, results[engine.name].get(name))
            failed += cells[engine.name][0] == "FAIL"
        rows.append((name, cells))
        print(f"{name}:")
        for engine in engines:
            status, detail = cells[engine.name]
            print(f"  {versions[engine.name]:<46} {status:<8} {detail}")
    command = "python scripts/check_exports.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "started": started,
                    "versions": versions,
                    "manifest": manifest,
                    "results": results,
                    "verdicts": {n: c for n, c in rows},
                },
                indent=1,
            )
        )
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, engines, versions, command, started))
    print(f"check_exports: {failed} failure(s) over {len(rows)} plans x {len(engines)} engines; work files in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
