"""A ``torch.distributed.checkpoint`` storage layer without pickle: safetensors chunks + JSON metadata.

Why not DCP's own ``FileSystemWriter``/``FileSystemReader``: they pickle the checkpoint's
``.metadata`` and ``torch.save`` each tensor; loading those means unpickling files from a user's
directory. DCP's Hugging Face storage (``hf_storage``) avoids pickle, but what it writes and how it
reads sharded chunks changed between torch releases (2.7 ... 2.13), and it carries only tensors under
its own naming. So this module implements DCP's two small, stable interfaces (``StorageWriter`` and
``StorageReader``, unchanged in substance since torch 2.3) itself:

* each rank writes the chunks it owns to one ``__<rank>.safetensors`` file (safetensors: a JSON header
  and raw little-endian bytes; reading it executes nothing), keyed ``<fqn>@<offsets>``;
* the coordinator writes ``metadata.json``: for every tensor its global size, dtype, and each chunk's
  offsets, sizes, file and key. Reading rebuilds DCP's ``Metadata`` from that JSON;
* only tensors are accepted (a non-tensor value is a programming error here): the trainer keeps its
  scalars and the plan in JSON beside the tensors (files.py).

DCP's planners do the rest: each rank saves its shards under layout-independent names (state.py), and
a load into any other layout reads exactly the overlapping pieces of the stored chunks. For export
(one process, no process group) ``read_full`` assembles whole tensors from the same files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from exatrain.data.dataset import plain_name
from exatrain.jsonio import write_json_atomic
from exatrain.trainer.checkpoint import files
from exatrain.trainer.checkpoint.files import METADATA, CheckpointError

TORCH_DTYPES = {name: getattr(torch, name) for name in files.SAFETENSORS_DTYPES}


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise TypeError(f"cannot checkpoint tensors of dtype {dtype}")
    return name


def _key(fqn: str, offsets) -> str:
    return f"{fqn}@{','.join(str(int(o)) for o in offsets)}"


class _AtPath:
    """The checkpoint directory a storage writer or reader works in (DCP may reset it per save/load)."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__()
        self.path = Path(path)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            self.path = Path(checkpoint_id)


class SafetensorsWriter(_AtPath, StorageWriter):
    """DCP StorageWriter: one safetensors file per rank, metadata.json from the coordinator."""

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.path.mkdir(parents=True, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(plan, storage_data=f"__{i}.safetensors") for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        from safetensors.torch import save_file

        file = plan.storage_data
        tensors: dict[str, torch.Tensor] = {}
        results = []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                raise TypeError(f"{item.index.fqn}: only tensors go into a checkpoint's safetensors files")
            data = planner.resolve_data(item)
            key = _key(item.index.fqn, item.index.offset or ())
            tensors[key] = data.detach().to("cpu").contiguous().clone()
            results.append(
                WriteResult(
                    index=item.index,
                    size_in_bytes=tensors[key].numel() * tensors[key].element_size(),
                    storage_data={"file": file, "key": key},
                )
            )
        if tensors:
            save_file(tensors, str(self.path / file))
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        where = {(r.index.fqn, tuple(r.index.offset or ())): r.storage_data for rank in results for r in rank}
        tensors = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                raise TypeError(f"{fqn}: only tensors go into a checkpoint")
            tensors[fqn] = {
                "dtype": _dtype_name(md.properties.dtype),
                "size": list(md.size),
                "chunks": [
                    {"offsets": list(c.offsets), "sizes": list(c.sizes), **where[(fqn, tuple(c.offsets))]}
                    for c in md.chunks
                ],
            }
        write_json_atomic(
            self.path / METADATA, {"format": files.TABLE_FORMAT, "version": 1, "tensors": tensors}, indent=1
        )

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return True


def read_metadata_json(path: str | os.PathLike, listed: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """metadata.json's tensor table, every field checked against the safetensors files' headers
    (files.read_tensor_table; a CheckpointError names what is wrong). ``listed``: the files a chunk
    may name (a manifest's); by default the plain-named regular files of the directory (a save
    being published has no manifest yet)."""
    path = Path(path)
    if listed is None:
        listed = {f.name: {} for f in path.iterdir() if plain_name(f.name) and f.is_file() and not f.is_symlink()}
    return files.read_tensor_table(path, listed)


class SafetensorsReader(_AtPath, StorageReader):
    """DCP StorageReader for what SafetensorsWriter wrote: JSON metadata, sliced safetensors reads."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        md: dict[str, Any] = {}
        storage: dict[MetadataIndex, dict[str, str]] = {}
        for fqn, t in read_metadata_json(self.path).items():
            chunks = []
            for c in t["chunks"]:
                chunks.append(ChunkStorageMetadata(offsets=torch.Size(c["offsets"]), sizes=torch.Size(c["sizes"])))
                storage[MetadataIndex(fqn, c["offsets"])] = {"file": c["file"], "key": c["key"]}
            md[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=TORCH_DTYPES[t["dtype"]]), size=torch.Size(t["size"]), chunks=chunks
            )
        return Metadata(state_dict_metadata=md, storage_data=storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        per_file: dict[str, list] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index]["file"], []).append(req)
        for file, reqs in per_file.items():
            with _opened(self.path, file) as f:
                for req in reqs:
                    key = self.storage_data[req.storage_index]["key"]
                    piece = _read_slice(f, key, req.storage_offsets, req.lengths)
                    target = planner.resolve_tensor(req).detach()
                    if target.size() != piece.size():
                        raise CheckpointError(
                            f"{self.path}: {key} holds {list(piece.size())}, expected {list(target.size())}"
                        )
                    target.copy_(piece)
                    planner.commit_tensor(req, target)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return (Path(checkpoint_id) / METADATA).is_file()


@contextlib.contextmanager
def _opened(directory: Path, file: str) -> Iterator[Any]:
    """safe_open of a chunk file, its read errors (the library's SafetensorError, OSError) one
    CheckpointError line: files.verify checked the file, so this is one changed since."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(directory / file), framework="pt", device="cpu") as f:
            yield f
    except (SafetensorError, OSError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{directory}: {file} is unreadable ({first})") from None


def _read_slice(f, key: str, offsets, lengths) -> torch.Tensor:
    if len(lengths) == 0:
        return f.get_tensor(key)
    return f.get_slice(key)[tuple(slice(int(o), int(o) + int(n)) for o, n in zip(offsets, lengths))]


def read_full(path: str | os.PathLike, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor whose name starts with ``prefix`` (prefix removed), whole, assembled from its
    chunks: one process, no process group (export, tests)."""
    path = Path(path)
    table = {k: v for k, v in read_metadata_json(path).items() if k.startswith(prefix)}
    out = {k[len(prefix) :]: torch.empty(v["size"], dtype=TORCH_DTYPES[v["dtype"]]) for k, v in table.items()}
    by_file: dict[str, list[tuple[str, dict]]] = {}
    for k, v in table.items():
        for c in v["chunks"]:
            by_file.setdefault(c["file"], []).append((k, c))
    for file, items in by_file.items():
        with _opened(path, file) as f:
            for k, c in items:
                piece = f.get_tensor(c["key"])
                target = out[k[len(prefix) :]]
                for dim, (o, n) in enumerate(zip(c["offsets"], c["sizes"])):
                    target = target.narrow(dim, o, n)
                target.copy_(piece)
    return out


__all__ = ["SafetensorsReader", "SafetensorsWriter", "read_full", "read_metadata_json"]
