"""Where the offline data lives: the project's sibling ``shared/`` folder and the decode cache."""

from __future__ import annotations

import os
from pathlib import Path

SHARED_DIR_ENV = "DPNOISE_SHARED_DIR"
CACHE_DIR_ENV = "DPNOISE_CACHE"


def _candidate_shared_dirs() -> list[Path]:
    """``shared/`` folders next to any ancestor of this package and of the working directory."""
    starts = [Path(__file__).resolve().parent, Path.cwd().resolve()]
    return [ancestor / "shared" for start in starts for ancestor in (start, *start.parents)]


def shared_dir() -> Path | None:
    """The ``shared/`` folder holding ``data/`` (cifar10-jpeg, sst2), or None if none is found.

    ``$DPNOISE_SHARED_DIR`` wins when set; otherwise the first ``shared/`` with a ``data/`` inside,
    walking up from the package (an editable checkout) and then from the working directory.
    """
    env = os.environ.get(SHARED_DIR_ENV)
    if env:
        return Path(env).expanduser()
    for candidate in _candidate_shared_dirs():
        if (candidate / "data").is_dir():
            return candidate
    return None


def shared_data_dir(dataset_folder: str) -> Path:
    """``<shared>/data/<dataset_folder>`` (a path that may not exist, for error messages)."""
    base = shared_dir()
    if base is None:
        base = Path("..") / "shared"
    return base / "data" / dataset_folder


def cache_dir() -> Path:
    """Cache for decoded data and extracted features: ``$DPNOISE_CACHE`` or ``~/.cache/dpnoise``."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dpnoise"
