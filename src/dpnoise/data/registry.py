"""Named datasets: :func:`load_dataset`, :func:`dataset_info` and deterministic subsets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from dpnoise.data import text, vision
from dpnoise.data.errors import InvalidDatasetError
from dpnoise.checks import parse_source
from dpnoise.data.files import DATASETS_INSTALL, DEFAULT_EVAL_FRACTION, IMAGE_MEAN, IMAGE_STD, FileSplits, read_source

SPLITS = ("train", "test", "dev")


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset is: shapes, sizes, pixel statistics and how to install it.

    ``input_shape`` is ``(C, H, W)`` for images and ``()`` for text (raw sentences).
    ``mean``/``std`` are per channel, on pixel values scaled to [0, 1] (``pixel_max`` -> 1).
    ``display_name`` is how results must be labelled (the CIFAR-10 copy is lossy JPEG).
    ``dev_size``: the size of a third, ``dev`` split (None: the dataset has none).
    """

    name: str
    display_name: str
    modality: str
    num_classes: int
    input_shape: tuple[int, ...]
    train_size: int
    test_size: int
    install: str
    pixel_max: float = 255.0
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    dev_size: int | None = None

    @property
    def splits(self) -> tuple[str, ...]:
        return SPLITS if self.dev_size is not None else SPLITS[:2]

    def size(self, split: str) -> int:
        """Number of examples in ``split``."""
        sizes = {"train": self.train_size, "test": self.test_size, "dev": self.dev_size}
        return sizes[_check_split(split, self)]


DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo("mnist", "MNIST", "image", 10, (1, 28, 28), 60_000, 10_000, vision.MNIST_INSTALL,
                    mean=(0.1307,), std=(0.3081,)),
        DatasetInfo("fashion-mnist", "Fashion-MNIST", "image", 10, (1, 28, 28), 60_000, 10_000,
                    vision.FASHION_MNIST_INSTALL, mean=(0.2860,), std=(0.3530,)),
        DatasetInfo("digits", "scikit-learn digits (8x8)", "image", 10, (1, 8, 8), 1_437, 360,
                    vision.DIGITS_INSTALL, pixel_max=16.0, mean=(0.3053,), std=(0.3760,)),
        DatasetInfo("cifar10-jpeg", "CIFAR-10 (JPEG q75 copy)", "image", 10, (3, 32, 32), 50_000, 10_000,
                    vision.CIFAR10_JPEG_INSTALL, mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616)),
        DatasetInfo("sst2", "SST-2 (GLUE)", "text", 2, (), 67_349, 1_821, text.SST2_INSTALL, dev_size=872),
    )
}

_IMAGE_LOADERS: dict[str, Callable[[str, Path | None], tuple[np.ndarray, np.ndarray]]] = {
    "mnist": vision.load_mnist,
    "fashion-mnist": vision.load_fashion_mnist,
    "digits": lambda split, root: vision.load_digits_split(split),
    "cifar10-jpeg": vision.load_cifar10_jpeg,
}


#: the examples of the data sets registered from a user's files (:func:`register_file_dataset`), by name
_FILE_SPLITS: dict[str, FileSplits] = {}


def register_file_dataset(name: str, *, text_column: str | None = None, text_pair_column: str | None = None,
                          label_column: str = "label", eval_fraction: float = DEFAULT_EVAL_FRACTION,
                          unit_column: str | None = None) -> DatasetInfo:
    """Read a user's data set named by its source (``csv:PATH``, ``imagefolder:PATH``, ...;
    :mod:`dpnoise.data.files`) and register it under that name in :data:`DATASETS`, so that
    :func:`load_dataset` and :func:`dataset_info` serve it (its splits: ``train`` and ``test``, the
    source's evaluation split or a held-out ``eval_fraction`` of each class)."""
    source = parse_source(name)
    if source is None:
        raise InvalidDatasetError(f"{name!r} is not a file source (kind:PATH, kind one of csv, json, parquet, "
                                  f"imagefolder, disk)")
    splits = read_source(source, text_column=text_column, text_pair_column=text_pair_column,
                         label_column=label_column, eval_fraction=eval_fraction, unit_column=unit_column)
    image = splits.modality == "image"
    channels = splits.train[0].shape[1] if image else 0
    info = DatasetInfo(name, str(source.path), splits.modality, len(splits.label_names),
                       tuple(splits.train[0].shape[1:]) if image else (), len(splits.train_labels),
                       len(splits.test_labels), DATASETS_INSTALL, pixel_max=1.0,
                       mean=(IMAGE_MEAN,) * channels, std=(IMAGE_STD,) * channels)
    DATASETS[name], _FILE_SPLITS[name] = info, splits
    return info


def label_names(name: str) -> tuple[str, ...] | None:
    """The label of each class id of a data set registered from files (None for a packaged data set)."""
    splits = _FILE_SPLITS.get(name)
    return None if splits is None else splits.label_names


def privacy_units_of(name: str) -> list | None:
    """Each training example's privacy unit of a data set registered from files with a unit column (None
    otherwise)."""
    splits = _FILE_SPLITS.get(name)
    return None if splits is None else splits.train_units


def _check_split(split: str, info: DatasetInfo) -> str:
    if split not in info.splits:
        raise InvalidDatasetError(f"split of {info.name} must be one of {', '.join(info.splits)}, got {split!r}")
    return split


def dataset_info(name: str) -> DatasetInfo:
    """Static description of a named dataset (no file is read)."""
    try:
        return DATASETS[name]
    except KeyError:
        raise InvalidDatasetError(f"unknown dataset {name!r}; choose from {sorted(DATASETS)}") from None


def stratified_first_k(labels: np.ndarray, k: int) -> np.ndarray:
    """Indices (ascending) of a deterministic, class-balanced subset of size ``min(k, N)``.

    Examples are ranked by their position within their own class; the subset takes every class's
    rank-0 example, then rank 1, and so on (ties broken by index), so class counts differ by at
    most one unless a class runs out.
    """
    if k < 0:
        raise InvalidDatasetError(f"subset size must be >= 0, got {k}")
    labels = np.asarray(labels)
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    first_of_class = np.searchsorted(sorted_labels, sorted_labels, side="left")
    rank = np.empty(len(labels), dtype=np.int64)
    rank[order] = np.arange(len(labels)) - first_of_class
    chosen = np.lexsort((np.arange(len(labels)), rank))[:k]
    return np.sort(chosen)


def _to_tensor(images: np.ndarray, info: DatasetInfo, normalize: bool) -> torch.Tensor:
    """Scale integer pixels to [0, 1] float32 and optionally standardise per channel."""
    x = torch.from_numpy(images).to(torch.float32).div_(info.pixel_max)
    if normalize:
        mean = torch.tensor(info.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(info.std, dtype=torch.float32).view(-1, 1, 1)
        x.sub_(mean).div_(std)
    return x


def load_dataset(
    name: str,
    split: str,
    root: str | Path | None = None,
    *,
    limit: int | None = None,
    normalize: bool = True,
) -> Dataset:
    """Load a named dataset from offline files.

    Image datasets return a ``TensorDataset`` of ``(x, y)``: ``x`` float32 ``(N, C, H, W)``, scaled
    to [0, 1] then standardised with the dataset's mean/std when ``normalize`` (the default), ``y``
    int64.  ``sst2`` returns a :class:`~dpnoise.data.text.TextDataset` of raw sentences; turn it into
    token ids with :func:`dpnoise.data.text.tokenize`.

    Args:
        name: one of ``mnist``, ``fashion-mnist``, ``digits``, ``cifar10-jpeg``, ``sst2``.
        split: ``train`` or ``test``, or ``dev`` (``sst2``: GLUE's validation sentences).
        root: folder holding the dataset's files instead of the default location (ignored by
            ``digits``, which is bundled with scikit-learn).
        limit: keep a deterministic class-balanced subset of this many examples (fast tests).
        normalize: standardise images (no effect on ``sst2``).

    Raises:
        DatasetNotAvailableError: the files are missing; the message names the install command.
    """
    info = dataset_info(name)
    _check_split(split, info)
    if name in _FILE_SPLITS:
        return _file_split(name, split, info, limit, normalize)
    folder = Path(root) if root is not None else None
    if info.modality == "text":
        dataset = text.load_sst2(split, folder)
        if limit is None:
            return dataset
        keep = stratified_first_k(dataset.labels.numpy(), limit)
        return text.TextDataset([dataset.sentences[i] for i in keep], dataset.labels[keep])
    images, labels = _IMAGE_LOADERS[name](split, folder)
    if limit is not None:
        keep = stratified_first_k(labels, limit)
        images, labels = images[keep], labels[keep]
    return TensorDataset(_to_tensor(images, info, normalize), torch.from_numpy(labels))


def _file_split(name: str, split: str, info: DatasetInfo, limit: int | None, normalize: bool) -> Dataset:
    """A split of a data set registered from files, as the packaged ones are served."""
    splits = _FILE_SPLITS[name]
    examples, labels = (splits.train, splits.train_labels) if split == "train" else (splits.test, splits.test_labels)
    keep = None if limit is None else stratified_first_k(labels.numpy(), limit)
    if keep is not None:
        labels = labels[keep]
    if info.modality == "text":
        sentences, pairs = examples
        if keep is not None:
            sentences, pairs = [sentences[i] for i in keep], None if pairs is None else [pairs[i] for i in keep]
        return text.TextDataset(sentences, labels, pairs)
    images = examples[0] if keep is None else examples[0][keep]
    return TensorDataset((images - IMAGE_MEAN) / IMAGE_STD if normalize else images, labels)
