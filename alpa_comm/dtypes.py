"""Element sizes of the dtypes a plan may carry.

Planning only needs the byte size of one element, so this stays NumPy-free for
dtypes NumPy lacks (bfloat16) and gives one clear error for unknown names.
"""
from __future__ import annotations

from .errors import InvalidOptionError

ITEMSIZE = {
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "complex64": 8,
    "complex128": 16,
}


def dtype_name(dtype) -> str:
    """Canonical name of ``dtype`` (a string, NumPy dtype or scalar type)."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if name not in ITEMSIZE:
        raise InvalidOptionError(
            f"unknown dtype {dtype!r}; known: {', '.join(sorted(ITEMSIZE))}")
    return name


def itemsize(dtype) -> int:
    """Bytes per element of ``dtype``."""
    return ITEMSIZE[dtype_name(dtype)]
