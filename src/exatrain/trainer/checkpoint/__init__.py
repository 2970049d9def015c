"""Checkpoints: ``torch.distributed.checkpoint`` with a pickle-free storage layer, layout-free names.

files.py (directories, manifest, verification, which one to resume; no torch) -> storage.py (DCP
StorageWriter/StorageReader over safetensors + JSON) -> state.py (layout-independent state dicts)
-> manager.py (atomic save, keep-last-k, async, load) ; compat.py checks a checkpoint fits a model.
"""
