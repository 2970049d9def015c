"""Devices and clusters: typed specs, the built-in catalog, and user-supplied cluster files.

A cluster is a device type, a number of devices per node, and an ordered list of link tiers.
Each tier says how many consecutive ranks it connects (``span``) and what one rank can push over
it (bandwidth per direction, latency). A group of ranks is served by the narrowest tier that
spans it: on Frontier two ranks of one MI250X talk over the 200 GB/s GCD pair, eight ranks of a
node over the slower Infinity Fabric links, and anything larger crosses Slingshot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from exatrain.catalog.models import _load_table_file
from exatrain.errors import UserError

FP8_DTYPES = ("float8", "fp8", "float8_e4m3fn", "float8_e5m2")


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or the host CPU). Peak figures are dense, per device."""

    name: str
    peak_tflops: float | None  # dense bf16/fp16 tensor-core peak; None where no datasheet figure applies
    hbm_bytes: int  # memory visible to the framework
    hbm_bytes_per_s: float  # memory bandwidth
    peak_tflops_fp32: float | None = None  # dense fp32 (non-tensor-core) peak, for float32 runs
    vendor: str = ""
    description: str = ""
    peak_tflops_fp8: float | None = None  # dense fp8 (E4M3/E5M2) tensor peak; None where the device has none
    link_bytes_per_s: float | None = None  # scale-up links (NVLink / Infinity Fabric), all of them, per direction
    tdp_watts: float | None = None  # the data sheet's maximum power of one device (TDP / total board power)

    @property
    def is_host(self) -> bool:
        """The host CPU (catalog vendor "host"): no separate streams, so nothing runs beside the compute."""
        return self.vendor == "host"

    def peak_flops(self, dtype: str) -> float | None:
        """Peak FLOP/s for a GEMM dtype ('bfloat16'/'float16', 'float32', or 'float8' for fp8
        GEMMs); None if unknown."""
        if dtype in FP8_DTYPES:
            tf = self.peak_tflops_fp8
        else:
            tf = self.peak_tflops_fp32 if dtype == "float32" else self.peak_tflops
        return None if tf is None else tf * 1e12


@dataclass(frozen=True)
class LinkTier:
    """Links that connect groups of up to ``span`` consecutive ranks."""

    name: str
    span: int  # ranks reachable over this tier (0 = unbounded: the inter-node network)
    bytes_per_s: float  # per rank, per direction
    latency_s: float

    def covers(self, group_ranks: int) -> bool:
        return self.span == 0 or group_ranks <= self.span


@dataclass(frozen=True)
class FileSystemSpec:
    """Where a run's checkpoints go: the file system's aggregate write and read rates (bytes/s, all of it for one
    job) and where the figures come from."""

    name: str
    write_bytes_per_s: float
    read_bytes_per_s: float
    description: str = ""
    source: str = ""


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    device: DeviceSpec
    gpus_per_node: int
    tiers: tuple[LinkTier, ...]  # narrowest first; the last one is unbounded (span 0)
    description: str = ""
    filesystem: FileSystemSpec | None = None  # None: the catalog's DEFAULT_FILESYSTEM (planner/goodput.py)
    # The host: memory per node (what offloaded model states live in) and one device's link to it (PCIe or the
    # CPU-GPU fabric), per direction; None where the catalog states none (then nothing is planned in host memory).
    host_memory_bytes: int | None = None
    host_link_bytes_per_s: float | None = None

    def tier_for(self, span_ranks: int) -> LinkTier:
        """The tier that carries traffic among ``span_ranks`` consecutive ranks."""
        for tier in self.tiers:
            if tier.covers(span_ranks):
                return tier
        return self.tiers[-1]

    @property
    def network(self) -> LinkTier:
        return self.tiers[-1]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_CATALOG: tuple[dict[str, DeviceSpec], dict[str, ClusterSpec], dict[str, FileSystemSpec]] | None = None


def _device_from(name: str, fields: Mapping[str, Any], source: str) -> DeviceSpec:
    known = {f.name for f in dataclasses.fields(DeviceSpec)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UserError(f"{source}: unknown device field(s) {', '.join(unknown)}")
    for req in ("hbm_bytes", "hbm_bytes_per_s"):
        if req not in fields:
            raise UserError(f"{source}: device {name!r} is missing {req}")
    spec = DeviceSpec(
        name=name,
        peak_tflops=fields.get("peak_tflops"),
        **{k: v for k, v in fields.items() if k not in ("name", "peak_tflops")},
    )
    for field in ("hbm_bytes", "hbm_bytes_per_s"):
        value = getattr(spec, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UserError(f"{source}: device {name!r} {field} must be a positive number, got {value!r}")
    for field in ("peak_tflops", "peak_tflops_fp32", "peak_tflops_fp8", "link_bytes_per_s", "tdp_watts"):
        value = getattr(spec, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise UserError(f"{source}: device {name!r} {field} must be a positive number, got {value!r}")
    return spec


def _filesystem_from(name: str, fields: Mapping[str, Any], source: str) -> FileSystemSpec:
    """A file system table: write_bytes_per_s and read_bytes_per_s (positive numbers), description, source."""
    known = {f.name for f in dataclasses.fields(FileSystemSpec)} - {"name"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UserError(f"{source}: file system {name!r}: unknown field(s) {', '.join(unknown)}")
    for field in ("write_bytes_per_s", "read_bytes_per_s"):
        value = fields.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise UserError(f"{source}: file system {name!r} {field} must be a positive number, got {value!r}")
    return FileSystemSpec(
        name=name,
        write_bytes_per_s=float(fields["write_bytes_per_s"]),
        read_bytes_per_s=float(fields["read_bytes_per_s"]),
        description=str(fields.get("description", "")),
        source=str(fields.get("source", "")),
    )


def _named_or_table(
    value: Any, catalog: Mapping[str, Any], build: Any, source: str, cluster: str, key: str, what: str
) -> Any:
    """A cluster's ``key`` (its device or file system): a catalog name looked up in ``catalog``, or a table of its
    own fields built by ``build(name, fields, source)``; anything else is a one-line error naming the cluster."""
    if isinstance(value, dict):
        return build(
            str(value.get("name", f"{cluster}-{key}")), {k: v for k, v in value.items() if k != "name"}, source
        )
    if isinstance(value, str):
        if value not in catalog:
            raise UserError(
                f"{source}: cluster {cluster!r} names unknown {what} {value!r}; known: {', '.join(sorted(catalog))}"
            )
        return catalog[value]
    raise UserError(f"{source}: cluster {cluster!r} {key} must be a catalog name or a table, got {value!r}")


def _cluster_from(
    name: str,
    fields: Mapping[str, Any],
    devices: Mapping[str, DeviceSpec],
    source: str,
    filesystems: Mapping[str, FileSystemSpec] | None = None,
) -> ClusterSpec:
    fields = dict(fields)
    fs = fields.pop("filesystem", None)
    filesystems = filesystems if filesystems is not None else filesystem_catalog()
    filesystem: FileSystemSpec | None = None
    if fs is not None:
        filesystem = _named_or_table(fs, filesystems, _filesystem_from, source, name, "filesystem", "file system")
    dev = fields.pop("device", None)
    if dev is None:
        raise UserError(f"{source}: cluster {name!r} needs `device` (a catalog name or a table)")
    device = _named_or_table(dev, devices, _device_from, source, name, "device", "device")
    gpn = fields.pop("gpus_per_node", None)
    if isinstance(gpn, bool) or not isinstance(gpn, int) or gpn <= 0:
        raise UserError(f"{source}: cluster {name!r} gpus_per_node must be a positive integer, got {gpn!r}")
    raw_tiers = fields.pop("tier", None) or fields.pop("tiers", None)
    if not isinstance(raw_tiers, list) or not raw_tiers:
        raise UserError(f"{source}: cluster {name!r} needs at least one [[cluster.{name}.tier]]")
    tiers = []
    for i, t in enumerate(raw_tiers):
        if not isinstance(t, dict):
            raise UserError(f"{source}: cluster {name!r} tier {i} must be a table")
        try:
            tier = LinkTier(
                name=str(t.get("name", f"tier{i}")),
                span=int(t.get("span", 0)),
                bytes_per_s=float(t["bytes_per_s"]),
                latency_s=float(t["latency_s"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(
                f"{source}: cluster {name!r} tier {i}: needs numeric bytes_per_s and latency_s ({exc})"
            ) from None
        if tier.bytes_per_s <= 0 or tier.latency_s < 0 or tier.span < 0:
            raise UserError(
                f"{source}: cluster {name!r} tier {tier.name!r}: bandwidth must be > 0, latency and span >= 0"
            )
        tiers.append(tier)
    spans = [t.span for t in tiers]
    if spans[-1] != 0:
        raise UserError(f"{source}: cluster {name!r}: the last tier must be the network (span 0)")
    if any(s == 0 for s in spans[:-1]) or spans[:-1] != sorted(spans[:-1]):
        raise UserError(f"{source}: cluster {name!r}: tiers must go from narrowest to widest span")
    description = str(fields.pop("description", ""))
    host = {k: fields.pop(k, None) for k in ("host_memory_bytes", "host_link_bytes_per_s")}
    for k, value in host.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise UserError(f"{source}: cluster {name!r} {k} must be a positive number, got {value!r}")
    if fields:
        raise UserError(f"{source}: cluster {name!r}: unknown field(s) {', '.join(sorted(fields))}")
    return ClusterSpec(
        name=name,
        device=device,
        gpus_per_node=gpn,
        tiers=tuple(tiers),
        description=description,
        filesystem=filesystem,
        host_memory_bytes=None if host["host_memory_bytes"] is None else int(host["host_memory_bytes"]),
        host_link_bytes_per_s=(None if host["host_link_bytes_per_s"] is None else float(host["host_link_bytes_per_s"])),
    )


def _catalog() -> tuple[dict[str, DeviceSpec], dict[str, ClusterSpec], dict[str, FileSystemSpec]]:
    global _CATALOG
    if _CATALOG is None:
        path = Path(__file__).with_name("data") / "hardware.toml"
        raw = _load_table_file(path)
        devices = {n: _device_from(n, f, path.name) for n, f in raw.get("device", {}).items()}
        filesystems = {n: _filesystem_from(n, f, path.name) for n, f in raw.get("filesystem", {}).items()}
        clusters = {n: _cluster_from(n, f, devices, path.name, filesystems) for n, f in raw.get("cluster", {}).items()}
        _CATALOG = (devices, clusters, filesystems)
    return _CATALOG


def filesystem_catalog() -> dict[str, FileSystemSpec]:
    """The catalog's file systems by name (where checkpoints are written: planner/goodput.py)."""
    return dict(_catalog()[2])


def device_catalog() -> dict[str, DeviceSpec]:
    return dict(_catalog()[0])


def cluster_catalog() -> dict[str, ClusterSpec]:
    return dict(_catalog()[1])


def get_device(name: str) -> DeviceSpec:
    devices = device_catalog()
    if name not in devices:
        raise UserError(
            f"unknown device {name!r}; known: {', '.join(sorted(devices))} (`exatrain hardware` lists them)"
        )
    return devices[name]


def get_cluster(name: str) -> ClusterSpec:
    clusters = cluster_catalog()
    if name not in clusters:
        raise UserError(
            f"unknown cluster {name!r}; known: {', '.join(sorted(clusters))} "
            "(`exatrain hardware` lists them), or describe yours with --cluster-file"
        )
    return clusters[name]


# Substrings of the names accelerators report (torch.cuda.get_device_name; ROCm reports through the
# same call) -> catalog device. Longer, more specific names first.
_DEVICE_NAME_MATCHES = (
    ("MI355X", "mi355x"),
    ("MI300X", "mi300x"),
    ("MI250X", "mi250x-gcd"),
    ("B200", "b200"),
    ("H200", "h200-sxm"),
    ("H100", "h100-sxm"),
    ("A100", "a100-80gb"),
)


def match_device(name: str) -> DeviceSpec | None:
    """The catalog device for a reported accelerator name ("NVIDIA H200" -> h200-sxm), or None
    when the catalog has no entry for it (then no peak is known and MFU is not reported)."""
    upper = name.upper()
    for needle, key in _DEVICE_NAME_MATCHES:
        if needle in upper:
            return device_catalog().get(key)
    return None


def load_cluster_file(path: str | Path) -> ClusterSpec:
    """A user's cluster file (TOML or JSON): `name`, `device` (catalog name or table),
    `gpus_per_node`, and a list `tier` of {name, span, bytes_per_s, latency_s}."""
    path = Path(path)
    data = _load_table_file(path)
    if "cluster" in data and isinstance(data["cluster"], dict):
        data = data["cluster"]
    data = dict(data)
    name = str(data.pop("name", path.stem))
    return _cluster_from(name, data, device_catalog(), str(path))
