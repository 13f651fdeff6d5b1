"""Privacy units larger than one example: a user, a document or a conversation protected as a whole.

Per-example DP protects one row.  When one person contributes many rows, ``make_private(...,
privacy_unit=keys)`` protects the person instead: ``keys[i]`` names the unit of example i (a user id,
a document id), and

* Poisson sampling draws units, not examples: every unit is in a step's batch independently with
  probability q = (expected units per batch) / (number of units), with all of its examples
  (``data_loader.batch_size`` is then the expected number of units per batch);
* a unit's gradient is the sum of its examples' gradients, clipped as one to C
  (:meth:`~dpnoise.training.per_example_gradients.ParameterGradients.by_unit`: book-keeping
  computes the units' norms from its rows, with nothing materialised that it would not materialise
  per example);
* adding or removing one unit changes the clipped sum by at most C, as adding or removing one
  example does per example: the mechanism's sensitivity is the same, so the accountants are
  unchanged at the unit sampling rate q, and the epsilon is a bound for any two data sets that
  differ in one unit's examples (all of them).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from dpnoise.training.errors import InvalidTrainingOptionError
from dpnoise.training.per_example_gradients import UnitGrouping


class PrivacyUnits:
    """The privacy unit of every example of a data set of ``size`` examples, from their ``keys``."""

    def __init__(self, keys: Sequence[Hashable], size: int):
        if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
            raise InvalidTrainingOptionError(f"privacy_unit must be a sequence of one key per example (a user or "
                                             f"document id), got {type(keys).__name__}")
        if len(keys) != size:
            raise InvalidTrainingOptionError(f"privacy_unit has {len(keys)} keys but the data set has {size} examples "
                                             f"(one key per example)")
        ids: dict[Hashable, int] = {}
        of_example = []
        for index, key in enumerate(keys.tolist() if hasattr(keys, "tolist") else keys):
            if _missing(key):
                raise InvalidTrainingOptionError(f"privacy_unit: example {index} has no key ({key!r}): every example "
                                                 f"must belong to a unit")
            try:
                of_example.append(ids.setdefault(key, len(ids)))
            except TypeError:
                raise InvalidTrainingOptionError(f"privacy_unit: example {index}'s key {key!r} is not hashable "
                                                 f"(use ids: numbers or strings)") from None
        #: ``(size,)`` the unit of each example, numbered ``0..count-1`` in order of first appearance
        self.of_example = torch.as_tensor(of_example, dtype=torch.long)
        #: the number of units
        self.count = len(ids)
        #: the largest unit's examples
        self.largest = int(torch.bincount(self.of_example).max()) if size else 0

    def grouping(self, indices: Sequence[int], device: torch.device) -> UnitGrouping:
        """The units of a batch of the examples ``indices`` (in the batch's order), on ``device``."""
        return UnitGrouping.of(self.of_example[torch.as_tensor(list(indices), dtype=torch.long)].to(device))


def _missing(key: Any) -> bool:
    """Whether ``key`` says "no unit": None, or a float NaN (a missing value read from a table)."""
    return key is None or (isinstance(key, float) and math.isnan(key))


__all__ = ["PrivacyUnits", "UnitGrouping"]
