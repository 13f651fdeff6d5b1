"""Reader for the IDX format of (Fashion-)MNIST, vectorised with NumPy."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from dpnoise.data.errors import InvalidDatasetError

# IDX type byte -> big-endian NumPy dtype.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(raw: bytes) -> np.ndarray:
    """Decode IDX bytes (magic ``00 00 <type> <ndim>``, ndim big-endian int32 dims, data)."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise InvalidDatasetError("not an IDX file (bad magic number)")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise InvalidDatasetError(f"IDX payload has {len(raw) - header} bytes, header says {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file, gzipped (``.gz``) or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        return parse_idx(handle.read())
