"""Named training recipes: published hyper-parameters as configuration fields (``dpnoise train --recipe``).

A recipe maps (dataset, model) to the values of :class:`~dpnoise.training.TrainingConfig` fields
(dotted paths, as :meth:`TrainingConfig.from_fields` takes them).  :func:`apply_recipe` lays
explicitly given values over them, so a recipe is a starting point that any field can override.

``scatternet``: Tramèr & Boneh, "Differentially Private Learning Needs Better Features (Or Much
More Data)", arXiv 2011.11660, the hyper-parameters of their public code's README
(ftramer/Handcrafted-DP) at (epsilon 3, delta 1e-5): SGD with momentum 0.9, clipping norm 0.1,
large batches, a large constant learning rate.  The epochs are those their noise multipliers
consume the budget in (40; 25 for the MNIST CNN; 60 on CIFAR-10).  Two deliberate differences:
GroupNorm (27 groups) on the scattering features for every dataset, where they used noisy
per-channel normalisation on MNIST and CIFAR-10 (it costs privacy budget: add
``data.feature_statistics_noise`` = 8, ``--feature-statistics-noise 8``, for it), and Poisson
sampling where they shuffled (the accountants assume Poisson sampling).
This module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from dpnoise.accounting.validation import InvalidParameterError


@dataclass(frozen=True)
class Recipe:
    """Field values shared by every (dataset, model), and those of each pair."""

    description: str
    common: Mapping[str, Any]
    #: (dataset, model) -> field values
    by_dataset_and_model: Mapping[tuple[str, str], Mapping[str, Any]]
    #: the model of a dataset when none is given
    default_model: str

    def fields(self, dataset: str, model: Optional[str] = None) -> dict[str, Any]:
        """The recipe's field values for ``dataset`` and ``model`` (default :attr:`default_model`)."""
        model = model or self.default_model
        specific = self.by_dataset_and_model.get((dataset, model))
        if specific is None:
            pairs = ", ".join(f"{d} with {m}" for d, m in self.by_dataset_and_model)
            raise InvalidParameterError(f"the recipe has no settings for dataset {dataset!r} with model {model!r}; "
                                        f"it covers {pairs}")
        return {**self.common, "model": model, **specific}


def _scatternet(batch_size: int, lr: float, epochs: float) -> dict[str, Any]:
    return {"schedule.batch_size": batch_size, "optimizer.lr": lr, "privacy.epochs": epochs}


RECIPES: dict[str, Recipe] = {
    "scatternet": Recipe(
        description="Tramèr & Boneh 2021 (arXiv 2011.11660): ScatterNet features, GroupNorm, SGD momentum 0.9, "
                    "clip 0.1, large batches and learning rates, epsilon 3 at delta 1e-5",
        common={"optimizer.name": "sgd", "optimizer.momentum": 0.9, "privacy.max_grad_norm": 0.1,
                "execution.max_physical_batch_size": 2048, "privacy.target_epsilon": 3.0, "privacy.delta": 1e-5},
        by_dataset_and_model={
            ("fashion-mnist", "scatternet-linear"): _scatternet(8192, 16.0, 40),
            ("fashion-mnist", "scatternet-cnn"): _scatternet(2048, 4.0, 40),
            ("mnist", "scatternet-linear"): _scatternet(4096, 8.0, 40),
            ("mnist", "scatternet-cnn"): _scatternet(1024, 1.0, 25),
            ("cifar10-jpeg", "scatternet-linear"): _scatternet(8192, 4.0, 60),
            ("cifar10-jpeg", "scatternet-cnn"): _scatternet(8192, 4.0, 60),
        },
        default_model="scatternet-linear",
    ),
}


def apply_recipe(values: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``values`` (dotted field paths; None means "not given") over recipe ``name``'s values for
    ``values["data.name"]`` and ``values.get("model")``."""
    recipe = RECIPES.get(name)
    if recipe is None:
        raise InvalidParameterError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    given = {path: value for path, value in values.items() if value is not None}
    fields = recipe.fields(given["data.name"], given.get("model"))
    if given.get("optimizer.name", fields.get("optimizer.name")) != fields.get("optimizer.name"):
        fields.pop("optimizer.momentum", None)  # the recipe's momentum belongs to its optimizer (SGD)
    return {**fields, **given}
