"""Errors raised by the dataset loaders."""

from __future__ import annotations

from dpnoise.errors import DpnoiseError


class DatasetNotAvailableError(DpnoiseError, FileNotFoundError):
    """A dataset's files are not on this machine.

    Nothing is ever downloaded at run time, so the message always says how to make the data
    available offline: ``install`` is the exact command (or the file to put in place).
    """

    def __init__(self, dataset: str, missing: str, install: str) -> None:
        self.dataset = dataset
        self.missing = missing
        self.install = install
        super().__init__(f"dataset {dataset!r} is not available: {missing} not found. To install it: {install}")

    def __reduce__(self):  # picklable across the experiment runner's worker processes
        return (type(self), (self.dataset, self.missing, self.install))


class InvalidDatasetError(DpnoiseError, ValueError):
    """A dataset name, split or subset size is invalid, or a dataset file is malformed."""
