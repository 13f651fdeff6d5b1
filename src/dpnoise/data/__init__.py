"""Offline dataset loaders: MNIST, Fashion-MNIST, scikit-learn digits, CIFAR-10 (JPEG copy), SST-2.

Nothing is downloaded: a missing dataset raises :class:`DatasetNotAvailableError` naming the
install command (see ``../shared/data/README.md``).
"""

from dpnoise.data.errors import DatasetNotAvailableError, InvalidDatasetError
from dpnoise.checks import SOURCE_KINDS, parse_source
from dpnoise.data.registry import (
    DATASETS,
    DatasetInfo,
    dataset_info,
    label_names,
    privacy_units_of,
    load_dataset,
    register_file_dataset,
    stratified_first_k,
)
from dpnoise.data.text import TextDataset, TokenizedText, minilm_tokenizer, tokenize, tokenize_for_classifier

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "DatasetNotAvailableError",
    "InvalidDatasetError",
    "SOURCE_KINDS",
    "TextDataset",
    "TokenizedText",
    "dataset_info",
    "label_names",
    "privacy_units_of",
    "load_dataset",
    "parse_source",
    "register_file_dataset",
    "minilm_tokenizer",
    "stratified_first_k",
    "tokenize",
    "tokenize_for_classifier",
]
