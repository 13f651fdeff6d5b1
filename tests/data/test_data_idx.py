"""IDX parsing on synthetic bytes (independent of any installed dataset)."""

import gzip
import struct

import numpy as np
import pytest

from dpnoise.data.idx import parse_idx, read_idx


def _idx_bytes(array: np.ndarray, type_byte: int) -> bytes:
    header = bytes([0, 0, type_byte, array.ndim]) + struct.pack(f">{array.ndim}i", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def test_parse_idx_roundtrip_uint8_and_int32(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(parse_idx(_idx_bytes(images, 0x08)), images)
    values = np.array([-5, 70000, 3], dtype=np.int32)
    decoded = parse_idx(_idx_bytes(values, 0x0C))
    assert decoded.tolist() == [-5, 70000, 3]
    path = tmp_path / "x-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(_idx_bytes(images, 0x08)))
    assert np.array_equal(read_idx(path), images)


def test_parse_idx_rejects_bad_magic_and_truncation():
    good = _idx_bytes(np.zeros((2, 2), dtype=np.uint8), 0x08)
    with pytest.raises(ValueError, match="magic"):
        parse_idx(b"\x01" + good[1:])
    with pytest.raises(ValueError, match="bytes"):
        parse_idx(good[:-1])
