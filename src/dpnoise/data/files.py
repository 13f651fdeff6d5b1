"""A user's own data set, named by its source: ``csv:PATH``, ``json:PATH``, ``parquet:PATH`` (a table of a
text column, an optional second text column for pairs, and a label column), ``imagefolder:PATH`` (one
folder of images per class) or ``disk:PATH`` (a Hugging Face ``datasets`` folder saved with
``save_to_disk``).  Read with Hugging Face ``datasets`` (the ``data`` extra), offline.

:func:`register_file_dataset` reads the source once and registers it under its source name in
:data:`~dpnoise.data.registry.DATASETS`, so that :func:`~dpnoise.data.load_dataset` and
:func:`~dpnoise.data.dataset_info` serve it like a packaged data set:

* labels of any type map to ids 0..K-1 in sorted order (:func:`label_names` gives the names back);
  K follows the data; fewer than two classes, or a label of the evaluation split that the training
  split lacks, is refused;
* the evaluation split is the source's own (``test``, else ``validation``) where it has one, else a
  held-out fraction of the rows (``eval_fraction``), each row held out or not by a hash of its own content,
  so that one file trains and evaluates and adding or removing a row moves no other row between the splits
  (the epsilon of the training split then holds per row of the file);
* images are converted to the first image's mode (RGB or grey) and size, scaled to [0, 1] and
  standardised with the fixed mean and standard deviation 0.5 (statistics of the private images would
  be a release the accountants do not cover).

Every problem (a missing file or column, an empty file, an unreadable image) is an
:class:`~dpnoise.data.errors.InvalidDatasetError` naming the source and the file, row or column.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from dpnoise.checks import Source
from dpnoise.data.errors import DatasetNotAvailableError, InvalidDatasetError

DATASETS_INSTALL = "pip install 'dpnoise[data]' (Hugging Face datasets)"
#: the text columns tried, in order, where none is given
TEXT_COLUMNS = ("text", "sentence", "content", "review")
#: the fraction of each class held out for evaluation where the source has no evaluation split
DEFAULT_EVAL_FRACTION = 0.1
#: the fixed standardisation of images from files (data-independent)
IMAGE_MEAN, IMAGE_STD = 0.5, 0.5


@dataclass(frozen=True)
class FileSplits:
    """A registered data set's examples: the training and evaluation splits and the label names."""

    modality: str
    #: text: (sentences, pairs or None); images: float tensors (N, C, H, W) in [0, 1]
    train: tuple[Any, ...]
    test: tuple[Any, ...]
    train_labels: torch.Tensor
    test_labels: torch.Tensor
    label_names: tuple[str, ...]
    #: each training example's privacy unit (a user or document id; None: no unit column)
    train_units: Optional[list[Any]] = None


def read_source(source: Source, *, text_column: Optional[str] = None, text_pair_column: Optional[str] = None,
                label_column: str = "label", eval_fraction: float = DEFAULT_EVAL_FRACTION,
                unit_column: Optional[str] = None) -> FileSplits:
    """The examples of ``source`` (module docstring); ``unit_column``: the column naming each example's privacy
    unit (every row must have one)."""
    splits = _read_tables(source)
    first = splits["train"]
    if unit_column is not None and unit_column not in first.column_names:
        raise InvalidDatasetError(f"{source.name}: no privacy-unit column {unit_column!r} (columns: "
                                  f"{', '.join(first.column_names)})")
    modality = "image" if source.kind == "imagefolder" or _image_column(first) is not None else "text"
    if label_column not in first.column_names:
        raise InvalidDatasetError(f"{source.name}: no label column {label_column!r} (columns: "
                                  f"{', '.join(first.column_names)}); give --label-column")
    eval_name = next((name for name in ("test", "validation") if name in splits), None)
    train_labels = _column(first, label_column, source)
    if eval_name is None:
        held_out = _held_out(first, train_labels, eval_fraction, source)
        train_rows, test_rows = np.setdiff1d(np.arange(len(first)), held_out), held_out
        tables, test_labels = (first, first), [train_labels[i] for i in test_rows]
        train_labels = [train_labels[i] for i in train_rows]
    else:
        tables = (first, splits[eval_name])
        train_rows, test_rows = np.arange(len(first)), np.arange(len(splits[eval_name]))
        test_labels = _column(splits[eval_name], label_column, source)
    names = sorted({str(label) for label in train_labels})
    if len(names) < 2:
        raise InvalidDatasetError(f"{source.name}: the training split has {len(names)} class ({', '.join(names)}); "
                                  f"a classifier needs at least two")
    ids = {name: i for i, name in enumerate(names)}
    unseen = sorted({str(label) for label in test_labels} - set(ids))
    if unseen:
        raise InvalidDatasetError(f"{source.name}: label {unseen[0]!r} of the evaluation split is not in the training "
                                  f"split")
    encode = lambda labels: torch.tensor([ids[str(label)] for label in labels], dtype=torch.int64)  # noqa: E731
    if modality == "image":
        import datasets

        column = _image_column(first)
        tables = tuple(table.cast_column(column, datasets.Image(decode=False)) for table in tables)
        reference = _opened(tables[0], column, int(train_rows[0]), source)
        examples = [_images(table, column, rows, reference, source) for table, rows in zip(tables, (train_rows, test_rows))]
    else:
        text = text_column or next((c for c in TEXT_COLUMNS if c in first.column_names), None)
        if text is None or text not in first.column_names:
            raise InvalidDatasetError(f"{source.name}: no text column {text or ' or '.join(TEXT_COLUMNS)!r} (columns: "
                                      f"{', '.join(first.column_names)}); give --text-column")
        if text_pair_column is not None and text_pair_column not in first.column_names:
            raise InvalidDatasetError(f"{source.name}: no column {text_pair_column!r} for the second texts (columns: "
                                      f"{', '.join(first.column_names)})")
        examples = [(_strings(table, text, rows, source),
                     None if text_pair_column is None else _strings(table, text_pair_column, rows, source))
                    for table, rows in zip(tables, (train_rows, test_rows))]
    all_units = None if unit_column is None else _column(first, unit_column, source)
    units = None if all_units is None else [all_units[row] for row in train_rows]
    return FileSplits(modality, examples[0], examples[1], encode(train_labels), encode(test_labels), tuple(names),
                      units)


def _read_tables(source: Source) -> dict[str, Any]:
    """The source's splits as ``datasets.Dataset`` tables, by split name (one ``train`` at least)."""
    try:
        import datasets
    except ImportError:
        raise DatasetNotAvailableError(source.name, "the Python package datasets", DATASETS_INSTALL) from None
    if not source.path.exists():
        raise InvalidDatasetError(f"{source.name}: no such file or folder")
    datasets.disable_progress_bars()
    try:
        if source.kind == "disk":
            loaded = datasets.load_from_disk(str(source.path))
        elif source.kind == "imagefolder":
            loaded = datasets.load_dataset("imagefolder", data_dir=str(source.path))
        else:
            loaded = datasets.load_dataset(source.kind, data_files=str(source.path))
    except Exception as err:  # noqa: BLE001  (whatever datasets raises, the file is what is wrong)
        raise InvalidDatasetError(f"{source.name}: cannot read it: {type(err).__name__}: {err}") from None
    splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    if "train" not in splits:
        raise InvalidDatasetError(f"{source.name}: no 'train' split (splits: {', '.join(splits)})")
    if len(splits["train"]) == 0:
        raise InvalidDatasetError(f"{source.name}: no rows")
    return splits


def _column(table: Any, name: str, source: Source) -> list[Any]:
    """A column's values, class labels as their names (an image folder's folders)."""
    import datasets

    values = list(table[name])
    missing = next((row for row, value in enumerate(values) if value is None), None)
    if missing is not None:
        raise InvalidDatasetError(f"{source.name}: row {missing + 1} has no {name!r}")
    feature = table.features[name]
    return [feature.int2str(value) for value in values] if isinstance(feature, datasets.ClassLabel) else values


def _strings(table: Any, name: str, rows: np.ndarray, source: Source) -> list[str]:
    values = _column(table, name, source)
    return [str(values[i]) for i in rows]


def _held_out(table: Any, labels: list[Any], fraction: float, source: Source) -> np.ndarray:
    """Row indices of a held-out ``fraction`` of the rows: a row is held out when the hash of its own content
    (:func:`_row_identity`) falls below ``fraction``, so that adding or removing one row of the file moves no
    other row between the splits (the training split of two files that differ in one row differs in at most
    that row: the epsilon of the training split holds per row of the file).  Refused where a class ends with
    no training row, or no row is held out."""
    if not 0 < fraction < 1:
        raise InvalidDatasetError(f"the held-out fraction must be in (0, 1), got {fraction!r}")
    held = np.array([_hashed_fraction(identity) < fraction for identity in _row_identities(table, source)])
    if not held.any():
        raise InvalidDatasetError(f"{source.name}: too few rows to hold out an evaluation split (each row is held "
                                  f"out with probability {fraction:g} by a hash of its content); give a larger "
                                  f"--eval-fraction or an evaluation split of your own")
    keys = np.array([str(label) for label in labels])
    emptied = sorted(set(keys) - set(keys[~held]))
    if emptied:
        raise InvalidDatasetError(f"{source.name}: every row of class {emptied[0]!r} was held out for evaluation; "
                                  f"give a smaller --eval-fraction, more rows, or an evaluation split of your own")
    return np.flatnonzero(held)


def _row_identities(table: Any, source: Source) -> list[str]:
    """What identifies each row by its own content: every column's value, an image by its file's path in the
    source's folder (else its bytes' hash)."""
    import datasets

    image = _image_column(table)
    if image is not None:
        table = table.cast_column(image, datasets.Image(decode=False))
    columns = {name: table[name] for name in table.column_names}

    def value(item: Any) -> Any:
        if isinstance(item, dict) and "bytes" in item:  # an undecoded image
            path = item.get("path")
            return os.path.relpath(path, source.path) if path else hashlib.sha256(item.get("bytes") or b"").hexdigest()
        return item

    return [json.dumps({name: value(values[row]) for name, values in columns.items()}, sort_keys=True, default=str)
            for row in range(len(table))]


def _hashed_fraction(identity: str) -> float:
    """A uniform number in [0, 1) that depends on ``identity`` only (SHA-256)."""
    return int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "big") / 2.0**64


def _image_column(table: Any) -> Optional[str]:
    """The column of images (a ``datasets.Image`` feature), or None."""
    import datasets

    return next((name for name, feature in table.features.items() if isinstance(feature, datasets.Image)), None)


def _opened(table: Any, column: str, row: int, source: Source) -> Any:
    """Row ``row``'s image (``table``'s image column undecoded: its path and bytes), opened and loaded."""
    import io

    from PIL import Image

    record = table[row][column]
    where = record.get("path") or f"row {row + 1}"
    try:
        image = Image.open(io.BytesIO(record["bytes"]) if record.get("bytes") else record["path"])
        image.load()
    except Exception as err:  # noqa: BLE001  (whatever PIL raises, the image is what is wrong)
        raise InvalidDatasetError(f"{source.name}: cannot read image {where}: {type(err).__name__}: {err}") from None
    return image


def _images(table: Any, column: str, rows: np.ndarray, reference: Any, source: Source) -> tuple[torch.Tensor]:
    """The rows' images in the reference's mode and size, as float (N, C, H, W) in [0, 1]."""
    mode = "L" if reference.mode in ("L", "1", "I", "F") else "RGB"
    arrays = []
    for row in rows:
        image = _opened(table, column, int(row), source).convert(mode)
        if image.size != reference.size:
            image = image.resize(reference.size)
        array = np.asarray(image, dtype=np.float32) / 255.0
        arrays.append(array[None] if array.ndim == 2 else array.transpose(2, 0, 1))
    return (torch.from_numpy(np.stack(arrays)),)
