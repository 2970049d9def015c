"""Bytes per element of the training dtypes (one definition, shared by the accounting modules)."""

COMPUTE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
