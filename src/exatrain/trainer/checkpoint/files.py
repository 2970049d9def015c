"""Checkpoint directories on disk: names, the manifest, verification, and which one to resume.

    ckpt/
      step-00000200/                 one published checkpoint
        manifest.json                written last: the trainer state and sha256 + size of every file below
        trainer.json                 step, sampler cursor, plan, tokenizer identity, seed, skipped steps
        metadata.json                every tensor: global size, dtype, its chunks and where each is stored
        __0.safetensors ...          the chunks each rank wrote (see storage.py)
        tokenizer.json               the data's tokenizer (for export)
      .tmp-step-00000400/            a save in progress (or one a crash interrupted): never read

A checkpoint is written into a ``.tmp-`` directory, verified, given its manifest and only then renamed
to ``step-NNNNNNNN``; so a directory under that name with a manifest whose files all match is
complete. A ``.tmp-``/``.old-`` leftover is reported when checkpoints are looked for and removed
by the next save into that directory (a symlink is unlinked, never followed).

Everything read here is untrusted: a checkpoint directory may be damaged or crafted, with its hashes
recomputed to match. So ``verify`` type-checks every field of manifest.json, trainer.json (its plan
included) and metadata.json, accepts only plain file names the manifest lists (regular files, not
links), and reads every safetensors file's header (its own JSON, parsed here) to check that each
chunk metadata.json names is there with its dtype, shape and byte range. What it cannot know
without the model (every tensor name and shape against the model of the checkpoint's own plan)
``compat.check_consistent`` adds; ``newest_complete`` applies both and falls back to the previous
checkpoint when either fails. Nothing here imports torch at import time, and nothing unpickles.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from exatrain.data.dataset import plain_name, sha256_file
from exatrain.errors import UserError
from exatrain.plan import Plan
from exatrain.jsonio import write_json_atomic

MANIFEST_FORMAT = "exatrain-checkpoint"
VERSION = 1
TABLE_FORMAT = "exatrain-dcp-json"  # metadata.json (storage.py writes it)
MANIFEST = "manifest.json"
TRAINER = "trainer.json"
METADATA = "metadata.json"
TOKENIZER = "tokenizer.json"
_STEP = re.compile(r"^step-(\d{8,})$")
_LEFTOVER = re.compile(r"^\.(tmp|old)-step-\d{8,}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# dtype name in metadata.json -> (safetensors header dtype, bytes per element) (safetensors' format spec)
SAFETENSORS_DTYPES = {
    "float32": ("F32", 4),
    "float64": ("F64", 8),
    "float16": ("F16", 2),
    "bfloat16": ("BF16", 2),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses larger headers (its N_MAX_HEADER_SIZE)
# trainer.json: every field the trainer and export read, with its JSON type
TRAINER_FIELDS = {
    "step": int,
    "samples_consumed": int,
    "global_batch": int,
    "seq_len": int,
    "seed": int,
    "data_shuffle": bool,
    "tokenizer_sha256": str,
    "separator": str,
    "separator_id": int,
    "nan_skipped": int,
    "layout": dict,
    "plan": dict,
    "steps": int,
}


class CheckpointError(UserError):
    """A checkpoint that cannot be used: incomplete, corrupted, or for another model."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def tmp_dir_name(step: int) -> str:
    return f".tmp-{step_dir_name(step)}"


@dataclass(frozen=True)
class Manifest:
    path: Path
    step: int
    trainer: dict[str, Any]  # trainer.json's content, type-checked
    files: dict[str, dict[str, Any]]  # name -> {"bytes", "sha256"}
    plan: Plan  # trainer.json's plan (the layout the checkpoint was saved from)
    tensors: dict[str, dict[str, Any]]  # metadata.json's tensor table, checked against the files


def write_manifest(directory: Path, step: int) -> None:
    """Hash every file of ``directory`` (not the manifest itself) into manifest.json, durably."""
    files = {}
    for f in sorted(directory.iterdir()):
        if f.is_file() and f.name != MANIFEST and not f.name.startswith("."):
            files[f.name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    write_json_atomic(
        directory / MANIFEST,
        {"format": MANIFEST_FORMAT, "version": VERSION, "step": step, "files": files},
        durable=True,
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _read_json(path: Path, what: str, where: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{where}: {what} is unreadable ({str(exc).splitlines()[0][:200]})") from None
    except RecursionError:
        raise CheckpointError(f"{where}: {what} is unreadable (nested too deeply)") from None


def _describe(v: Any) -> str:
    return f"{type(v).__name__} {json.dumps(v)[:40]}"


def verify(path: str | Path, hashes: bool = True) -> Manifest:
    """The manifest of a complete, well-formed checkpoint; CheckpointError naming the checkpoint and
    the problem otherwise. ``hashes=False`` checks presence and sizes, not contents' hashes."""
    path = Path(path)
    try:
        return _verify(path, hashes)
    except OSError as exc:  # a file vanished or is unreadable while being checked
        raise CheckpointError(f"{path}: cannot read {exc.filename or ''} ({exc.strerror or exc})") from None


def _verify(path: Path, hashes: bool) -> Manifest:
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(
            f"{path}: no {MANIFEST}: the checkpoint is incomplete (its save did not finish) "
            "or is not an exatrain checkpoint"
        )
    raw = _read_json(mpath, MANIFEST, path)
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT or not isinstance(raw.get("files"), dict):
        raise CheckpointError(f"{path}: {MANIFEST} is not an exatrain checkpoint manifest")
    if raw.get("version") != VERSION or not _is_int(raw.get("version")):
        raise CheckpointError(f"{path}: checkpoint format version {raw.get('version')!r} is not {VERSION}")
    step = raw.get("step")
    if not _is_int(step) or step < 0:
        raise CheckpointError(f"{path}: {MANIFEST} step is {_describe(step)}, not a step number")
    named = _STEP.match(path.name)
    if named and int(named.group(1)) != step:
        raise CheckpointError(f"{path}: {MANIFEST} is of step {step}, not of the step its name says")
    files = raw["files"]
    for required in (TRAINER, METADATA):
        if required not in files:
            raise CheckpointError(f"{path}: {MANIFEST} lists no {required}")
    for name, info in files.items():
        if not plain_name(name) or name == MANIFEST:
            raise CheckpointError(f"{path}: {MANIFEST} names a file outside the checkpoint ({name[:80]!r})")
        if (
            not isinstance(info, dict)
            or not _is_int(info.get("bytes"))
            or not isinstance(info.get("sha256"), str)
            or not _SHA256.match(info["sha256"])
        ):
            raise CheckpointError(f"{path}: {MANIFEST} entry {name[:80]!r} is not an object with bytes and sha256")
        f = path / name
        try:
            st = f.lstat()
        except FileNotFoundError:
            raise CheckpointError(f"{path}: {name} is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path}: {name} is not a regular file (a link or a directory)")
        if st.st_size != info["bytes"]:
            raise CheckpointError(
                f"{path}: {name} is truncated or overwritten ({st.st_size} bytes, manifest says {info['bytes']})"
            )
        if hashes and sha256_file(f) != info["sha256"]:
            raise CheckpointError(f"{path}: {name} is corrupted (its sha256 differs from the manifest)")
    trainer = _read_json(path / TRAINER, TRAINER, path)
    if not isinstance(trainer, dict) or trainer.get("step") != step:
        raise CheckpointError(f"{path}: {TRAINER} does not match the manifest")
    plan = _check_trainer(path, trainer)
    tensors = read_tensor_table(path, files)
    return Manifest(path=path, step=step, trainer=trainer, files=files, plan=plan, tensors=tensors)


def layout_of(plan: Plan) -> dict[str, int]:
    """trainer.json's ``layout``: the degrees that place ranks (cp only when > 1, so checkpoints saved
    before context parallelism keep theirs); a resume onto the same one restores each rank's RNG state."""
    return {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, **({"cp": plan.cp} if plan.cp > 1 else {})}


def _check_trainer(path: Path, t: dict[str, Any]) -> Plan:
    """trainer.json's fields have their types, its plan parses, and the two agree."""
    for key, kind in TRAINER_FIELDS.items():
        v = t.get(key)
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise CheckpointError(
                f"{path}: {TRAINER} field {key!r} is {_describe(v) if key in t else 'missing'}, not {kind.__name__}"
            )
        if kind is int and key != "seed" and v < 0:
            raise CheckpointError(f"{path}: {TRAINER} field {key!r} is negative")
    try:
        plan = Plan.from_dict(t["plan"], source=f"{path / TRAINER}: plan")
    except UserError as exc:  # named by its file, also where the plan's own check names only the field
        text = str(exc)
        raise CheckpointError(text if str(path) in text else f"{path / TRAINER}: plan: {text}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a field of the wrong type
        raise CheckpointError(
            f"{path / TRAINER}: plan: malformed plan ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''})"
        ) from None
    if t["layout"] != layout_of(plan) or t["seq_len"] != plan.model.seq_len or t["global_batch"] != plan.global_batch:
        raise CheckpointError(f"{path}: {TRAINER}'s layout, seq_len or global batch disagree with its plan")
    return plan


def read_tensor_table(path: str | Path, listed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """metadata.json's tensor table, every field type-checked: each tensor a dtype and a global size,
    its chunks inside that size, tiling it exactly, and stored in safetensors files the manifest
    lists (``listed``) under keys whose header entries have the chunk's dtype, shape and byte range."""
    path = Path(path)
    raw = _read_json(path / METADATA, METADATA, path)
    if (
        not isinstance(raw, dict)
        or raw.get("format") != TABLE_FORMAT
        or raw.get("version") != 1
        or not isinstance(raw.get("tensors"), dict)
    ):
        raise CheckpointError(f"{path}: {METADATA} is not an exatrain tensor table")
    headers: dict[str, dict[str, Any]] = {}
    for fqn, t in raw["tensors"].items():
        where = f"{path}: {METADATA} entry {fqn!r}"
        if (
            not isinstance(t, dict)
            or t.get("dtype") not in SAFETENSORS_DTYPES
            or not _dims(t.get("size"))
            or not isinstance(t.get("chunks"), list)
            or not t["chunks"]
        ):
            raise CheckpointError(f"{where} is malformed (needs dtype, size and chunks)")
        size = t["size"]
        volume = 0
        boxes = []
        for c in t["chunks"]:
            if (
                not isinstance(c, dict)
                or not _dims(c.get("offsets"), len(size))
                or not _dims(c.get("sizes"), len(size))
                or not isinstance(c.get("file"), str)
                or not isinstance(c.get("key"), str)
            ):
                raise CheckpointError(f"{where} has a malformed chunk (needs offsets, sizes, file, key)")
            if any(o + n > s for o, n, s in zip(c["offsets"], c["sizes"], size)):
                raise CheckpointError(f"{where} has a chunk outside its size {size}")
            if c["file"] not in listed or not c["file"].endswith(".safetensors"):
                raise CheckpointError(
                    f"{where} names a file that is not one of the checkpoint's safetensors files ({c['file'][:80]!r})"
                )
            if c["file"] not in headers:
                headers[c["file"]] = safetensors_header(path / c["file"], path)
            _check_chunk(headers[c["file"]], c, t["dtype"], f"{where}: {c['file']}")
            volume += math.prod(c["sizes"])
            boxes.append((c["offsets"], c["sizes"]))
        if volume != math.prod(size) or _overlap(boxes):
            raise CheckpointError(f"{where}: its chunks do not tile its size {size} exactly")
    return raw["tensors"]


def _dims(v: Any, n: int | None = None) -> bool:
    """A list of non-negative ints (of length ``n`` when given)."""
    return isinstance(v, list) and (n is None or len(v) == n) and len(v) <= 8 and all(_is_int(x) and x >= 0 for x in v)


def _overlap(boxes: list[tuple[list[int], list[int]]]) -> bool:
    """Do any two chunks (offsets, sizes) share an element? Boxes overlap iff they overlap in every dim."""
    if len(boxes) < 2:
        return False
    import numpy as np

    lo = np.array([o for o, _ in boxes], dtype=np.int64).reshape(len(boxes), -1)
    hi = lo + np.array([n for _, n in boxes], dtype=np.int64).reshape(len(boxes), -1)
    meet = (lo[:, None, :] < hi[None, :, :]) & (lo[None, :, :] < hi[:, None, :])
    both = meet.all(axis=-1)
    np.fill_diagonal(both, False)
    return bool(both.any())


def safetensors_header(file: Path, where: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (an 8-byte little-endian length, then that much JSON:
    the format's spec), each entry checked to be {dtype, shape, data_offsets} inside the file."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
            raise CheckpointError(f"{where}: {file.name} is not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise CheckpointError(f"{where}: {file.name} has an unreadable safetensors header") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: {file.name} has an unreadable safetensors header")
    data_bytes = size - 8 - n
    for key, e in header.items():
        if key == "__metadata__":
            continue
        ok = (
            isinstance(e, dict)
            and isinstance(e.get("dtype"), str)
            and _dims(e.get("shape"))
            and _dims(e.get("data_offsets"), 2)
        )
        if not ok or not e["data_offsets"][0] <= e["data_offsets"][1] <= data_bytes:
            raise CheckpointError(f"{where}: {file.name} entry {key[:80]!r} is malformed or outside the file")
    return header


def _check_chunk(header: dict[str, Any], c: dict[str, Any], dtype: str, where: str) -> None:
    e = header.get(c["key"]) if c["key"] != "__metadata__" else None
    code, itemsize = SAFETENSORS_DTYPES[dtype]
    if e is None:
        raise CheckpointError(f"{where} lacks chunk {c['key'][:80]!r}")
    begin, end = e["data_offsets"]
    if e["dtype"] != code or e["shape"] != c["sizes"] or end - begin != math.prod(c["sizes"]) * itemsize:
        raise CheckpointError(
            f"{where} holds chunk {c['key'][:80]!r} as {e['dtype']} {e['shape']}, not {code} {c['sizes']}"
        )


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every published-looking checkpoint under ``root``, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP.match(d.name)
        if m and d.is_dir():
            found.append((int(m.group(1)), d))
    return sorted(found, reverse=True)


def leftovers(root: str | Path) -> list[Path]:
    """Unfinished saves under ``root`` (``.tmp-step-*``; ``.old-step-*`` from replacing a step), whatever
    they are (directories, files, links), sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _LEFTOVER.match(p.name))


def remove_path(path: Path) -> None:
    """Delete ``path`` without following a symbolic link: a link (or a file) is unlinked, a real
    directory removed with its contents (shutil.rmtree unlinks links inside, it does not descend
    into them). Nothing there: nothing to do."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def clear_leftovers(root: str | Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """Remove every unfinished save under ``root`` (remove_path), reporting each one through ``warn``
    (default: a line on stderr, a warning where one could not be removed); returns them."""
    gone = []
    for p in leftovers(root):
        try:
            remove_path(p)
        except OSError as exc:
            (warn or _stderr)(f"cannot remove unfinished checkpoint save {p} ({exc.strerror or exc})")
            continue
        (warn or _note)(f"removed unfinished checkpoint save {p}")
        gone.append(p)
    return gone


def _note(line: str) -> None:
    sys.stderr.write(line + "\n")


def _stderr(line: str) -> None:
    """The default ``warn``: one line on stderr. Messages carry no prefix of their own; each ``warn`` adds
    its own (the CLI's: ``exatrain CMD: warning:``)."""
    sys.stderr.write(f"warning: {line}\n")


def is_checkpoint_root(path: Path) -> bool:
    return path.is_dir() and not (path / MANIFEST).exists() and bool(list_checkpoints(path) or leftovers(path))


Check = Callable[[Manifest], None]


def _consistent(manifest: Manifest) -> None:
    """The tensors against the model of the checkpoint's own plan (compat.py, which imports torch)."""
    from exatrain.trainer.checkpoint.compat import check_consistent

    check_consistent(manifest)


def usable(path: Path, hashes: bool = True, check: Check | None = _consistent) -> Manifest:
    """verify, then ``check`` (by default: the tensors fit the checkpoint's own model)."""
    manifest = verify(path, hashes=hashes)
    if check is not None:
        check(manifest)
    return manifest


def newest_complete(
    root: str | Path, hashes: bool = True, warn: Callable[[str], None] | None = None, check: Check | None = _consistent
) -> Manifest | None:
    """The newest checkpoint under ``root`` that is usable; each one that is not is reported through
    ``warn`` (one line: which and why) and skipped, as is each unfinished save. None when there is none."""
    warn = warn or _stderr
    for p in leftovers(root):
        warn(f"ignoring unfinished checkpoint save {p} (the next save into {Path(root)} removes it)")
    for _, path in list_checkpoints(root):
        try:
            return usable(path, hashes=hashes, check=check)
        except CheckpointError as exc:
            warn(f"skipping checkpoint {exc}")
    return None


def resolve(
    resume: str | None,
    checkpoint_dir: str | None,
    hashes: bool = True,
    warn: Callable[[str], None] | None = None,
    check: Check | None = _consistent,
) -> Manifest | None:
    """What ``--resume`` names: None (start fresh), ``auto`` (the newest usable checkpoint in
    ``checkpoint_dir``, or nothing: a folder whose checkpoints are all unusable says so through ``warn``),
    or a path (that checkpoint; a checkpoint root means its newest)."""
    if resume is None:
        return None
    if resume == "auto":
        if checkpoint_dir is None:
            raise UserError("--resume auto needs --checkpoint-dir (where to look for checkpoints)")
        found = newest_complete(checkpoint_dir, hashes=hashes, warn=warn, check=check)
        skipped = list_checkpoints(checkpoint_dir)
        if found is None and skipped:  # each one was named above, with why; an empty folder is a first run
            (warn or _stderr)(
                f"no usable checkpoint in {checkpoint_dir} ({len(skipped)} skipped, each named above "
                "with why), starting from step 1"
            )
        return found
    path = Path(resume)
    if is_checkpoint_root(path):
        found = newest_complete(path, hashes=hashes, warn=warn, check=check)
        if found is None:
            raise CheckpointError(f"{path}: no complete checkpoint here")
        return found
    return usable(path, hashes=hashes, check=check)


def select(
    path: str | Path,
    step: int | None = None,
    warn: Callable[[str], None] | None = None,
    check: Check | None = _consistent,
) -> Manifest:
    """For export: a checkpoint directory, or under a checkpoint root the one of ``step`` (default: the
    newest usable one)."""
    path = Path(path)
    if is_checkpoint_root(path):
        if step is not None:
            return usable(path / step_dir_name(step), check=check)
        found = newest_complete(path, warn=warn, check=check)
        if found is None:
            raise CheckpointError(f"{path}: no complete checkpoint here")
        return found
    manifest = usable(path, check=check)
    if step is not None and manifest.step != step:
        raise CheckpointError(f"{path} is the checkpoint of step {manifest.step}, not {step}")
    return manifest


__all__ = [
    "CheckpointError",
    "METADATA",
    "MANIFEST",
    "Manifest",
    "SAFETENSORS_DTYPES",
    "TOKENIZER",
    "TRAINER",
    "layout_of",
    "clear_leftovers",
    "leftovers",
    "list_checkpoints",
    "newest_complete",
    "read_tensor_table",
    "remove_path",
    "resolve",
    "safetensors_header",
    "select",
    "step_dir_name",
    "tmp_dir_name",
    "usable",
    "verify",
    "write_manifest",
]
