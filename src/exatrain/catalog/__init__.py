"""The catalog: models, devices and clusters as data files with typed loaders.

Built-in entries live in ``data/*.toml``; users add their own with ``--model-file`` and
``--cluster-file`` (TOML or JSON, the same fields).
"""

from exatrain.catalog.hardware import (
    ClusterSpec,
    DeviceSpec,
    LinkTier,
    cluster_catalog,
    device_catalog,
    get_cluster,
    get_device,
    load_cluster_file,
    match_device,
)
from exatrain.catalog.hf_config import load_model_file
from exatrain.catalog.models import ModelSpec, get_model, model_presets

__all__ = [
    "ClusterSpec",
    "DeviceSpec",
    "LinkTier",
    "ModelSpec",
    "cluster_catalog",
    "device_catalog",
    "get_cluster",
    "get_device",
    "get_model",
    "load_cluster_file",
    "load_model_file",
    "match_device",
    "model_presets",
]
