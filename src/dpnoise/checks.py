"""Argument checks run before any work (command line, training configuration, reproduction runner).

Each check raises :class:`~dpnoise.accounting.validation.InvalidParameterError` (a
:class:`~dpnoise.errors.DpnoiseError`) whose one-line message starts with the flag, e.g.
``--clip must be finite and > 0, got 0.0``; the command line prints it as
``dpnoise <command>: error: <message>`` and exits with status 2.

Importing this module imports nothing heavy: :mod:`dpnoise.accounting` (SciPy) is loaded by the
first check, so that registering a subcommand's parser stays fast.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import zipfile
from numbers import Real
from pathlib import Path
from typing import Any, Optional, Sequence

#: the kinds of a user's data source a data set name may start with (``kind:PATH``, :mod:`dpnoise.data.files`)
SOURCE_KINDS = ("csv", "json", "parquet", "imagefolder", "disk")


class Source:
    """Where a user's data set is: its kind (one of :data:`SOURCE_KINDS`) and path."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind, self.path = kind, path

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.path}"


def parse_source(name: object) -> Optional[Source]:
    """The :class:`Source` a data set name gives (``kind:PATH``), or None for another name (a packaged one)."""
    if not isinstance(name, str):
        return None
    kind, separator, path = name.partition(":")
    if not separator or kind not in SOURCE_KINDS:
        return None
    if not path:
        raise _error(f"{name!r}: give the path after {kind}:")
    return Source(kind, Path(path))


class DatasetChoices(tuple):
    """The packaged data sets' names, which also hold every ``kind:PATH`` source name (what ``--dataset``
    accepts: argparse and the configuration's checks ask ``value in choices``)."""

    def __contains__(self, value: object) -> bool:
        return tuple.__contains__(self, value) or (isinstance(value, str) and value.partition(":")[0] in SOURCE_KINDS
                                                    and ":" in value)


#: checks of :mod:`dpnoise.accounting.validation` re-exported here (loaded on first use)
_FROM_ACCOUNTING = ("InvalidParameterError", "check_accounted", "check_delta", "check_positive", "check_sample_rate")

__all__ = [
    "InvalidParameterError",
    "OneLineErrorParser",
    "check_accounted",
    "check_count",
    "check_delta",
    "check_positive",
    "check_sample_rate",
    "checkpoint_file",
    "count_in",
    "each",
    "existing_folder",
    "finite_steps",
    "fraction",
    "input_file",
    "nonnegative",
    "optional",
    "output_file",
    "output_folder",
    "params",
    "seed",
]

class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``<prog>: error: <message>`` (status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def __getattr__(name: str) -> Any:
    if name in _FROM_ACCOUNTING:
        from dpnoise.accounting import validation

        return getattr(validation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _error(message: str) -> Exception:
    from dpnoise.accounting.validation import InvalidParameterError

    return InvalidParameterError(message)


def check_count(flag: str, value: object, minimum: int = 0) -> int:
    from dpnoise.accounting.validation import check_count

    return check_count(flag, value, minimum)


#: largest accepted number of trained parameters n (--params)
MAX_PARAMS = 10**12
#: largest accepted --seed (torch generators take 64-bit seeds; the engine uses seed + 2)
MAX_SEED = 2**32 - 1


def optional(check, flag: str, value, *args, **kwargs):
    """``check(flag, value, ...)`` unless ``value`` is None (an option that was not given)."""
    return None if value is None else check(flag, value, *args, **kwargs)


def _finite(flag: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _error(f"{flag} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise _error(f"{flag} must be finite, got {value!r}")
    return v


def nonnegative(flag: str, value: object) -> float:
    """Finite and >= 0 (weight decay)."""
    v = _finite(flag, value)
    if v < 0:
        raise _error(f"{flag} must be >= 0, got {value!r}")
    return v


def fraction(flag: str, value: object, *, low_open: bool = False, high_open: bool = True) -> float:
    """In [0, 1) by default; ``low_open`` / ``high_open`` exclude the ends."""
    v = _finite(flag, value)
    inside = (v > 0 if low_open else v >= 0) and (v < 1 if high_open else v <= 1)
    if not inside:
        interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
        raise _error(f"{flag} must be in {interval}, got {value!r}")
    return v


def open_fraction(flag: str, value: object) -> float:
    """In (0, 1) (a decay, a momentum that must do something)."""
    return fraction(flag, value, low_open=True)


def count_in(flag: str, value: object, minimum: int, maximum: int) -> int:
    """An integer in [minimum, maximum]."""
    n = check_count(flag, value, minimum)
    if n > maximum:
        raise _error(f"{flag} must be <= {maximum}, got {value!r}")
    return n


def seed(flag: str, value: object) -> int:
    """A random seed in [0, 2**32)."""
    return count_in(flag, value, 0, MAX_SEED)


def params(flag: str, value: object) -> int:
    """A number of trained parameters n in [1, :data:`MAX_PARAMS`]."""
    return count_in(flag, value, 1, MAX_PARAMS)


def finite_steps(flag: str, epochs: float, sample_rate: float) -> int:
    """The planned steps ceil(``epochs`` / ``sample_rate``)
    (:func:`~dpnoise.accounting.steps_from_epochs`): at least one, and few enough to count exactly."""
    from dpnoise.accounting.calibration import steps_from_epochs
    from dpnoise.accounting.validation import InvalidParameterError

    try:
        return steps_from_epochs(epochs, sample_rate)
    except InvalidParameterError as err:
        raise _error(f"{flag}: {err}") from None


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _writable_folder(flag: str, folder: Path) -> None:
    """``folder`` is a folder that takes new entries: a probe folder is created in it and removed at
    once (permission bits do not tell: root passes ``os.access`` on /proc, where nothing can be made)."""
    if not folder.is_dir():
        raise _error(f"{flag}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _error(f"{flag}: cannot write into {folder} (permission denied)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dpnoise-probe-", dir=folder))
    except OSError as err:
        raise _error(f"{flag}: cannot create anything in {folder} ({err.strerror or err})") from None


def output_folder(flag: str, path: os.PathLike | str) -> Path:
    """A folder that exists and is writable, or can be created (its nearest existing parent is a
    writable folder).  Nothing is created here."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise _error(f"{flag}: {path} exists and is not a folder")
        _writable_folder(flag, path)
        return path
    existing = _nearest_existing(path.absolute())
    if not existing.is_dir():
        raise _error(f"{flag}: cannot create {path}: {existing} is not a folder")
    _writable_folder(flag, existing)
    return path


def output_file(flag: str, path: os.PathLike | str, suffixes: Sequence[str] = ()) -> Path:
    """A file path in an existing, writable folder (not a folder itself); with ``suffixes``, its
    extension must be one of them."""
    path = Path(path)
    if suffixes and path.suffix.lower() not in suffixes:
        raise _error(f"{flag} must be a {' or '.join(suffixes)} file, got {str(path)!r}")
    if path.is_dir():
        raise _error(f"{flag}: {path} is a folder, not a file")
    folder = path.absolute().parent
    if not folder.exists():
        raise _error(f"{flag}: folder {path.parent} does not exist")
    _writable_folder(flag, folder)
    if path.exists() and not os.access(path, os.W_OK):
        raise _error(f"{flag}: cannot overwrite {path} (permission denied)")
    return path


def existing_folder(flag: str, path: os.PathLike | str) -> Path:
    """A folder that exists."""
    path = Path(path)
    if not path.is_dir():
        raise _error(f"{flag}: {path} is not an existing folder")
    return path


def input_file(flag: str, path: os.PathLike | str) -> Path:
    """A readable, non-empty file."""
    path = Path(path)
    if not path.exists():
        raise _error(f"{flag}: {path} does not exist")
    if not path.is_file():
        raise _error(f"{flag}: {path} is not a file")
    if not os.access(path, os.R_OK):
        raise _error(f"{flag}: cannot read {path} (permission denied)")
    if path.stat().st_size == 0:
        raise _error(f"{flag}: {path} is empty")
    return path


def checkpoint_file(flag: str, path: os.PathLike | str) -> Path:
    """A readable file in ``torch.save``'s archive format (what ``dpnoise train --out`` writes)."""
    path = input_file(flag, path)
    if not zipfile.is_zipfile(path):
        raise _error(f"{flag}: {path} is not a dpnoise checkpoint (not a torch.save archive)")
    return path


def each(check, flag: str, values: Optional[Sequence], *args, **kwargs) -> Optional[list]:
    """``check`` applied to every value of a multi-valued option (None passes)."""
    return None if values is None else [check(flag, v, *args, **kwargs) for v in values]
