"""Private training: ``make_private`` / :class:`PrivacyEngine`, DP optimizers, checkpoints, a loop,
and the whole pipeline of ``dpnoise train`` as one call, :func:`train_private` (a
:class:`TrainingConfig` in, a :class:`TrainingResult` out).

>>> model, optimizer, loader = make_private(model, optimizer, loader, mechanism="lap2",
...     target_epsilon=1.0, delta=1e-5, epochs=2, max_grad_norm=1.0, seed=0)   # doctest: +SKIP
>>> optimizer.privacy_engine.epsilon_by_accountant()                          # doctest: +SKIP
{'lap2': 0.99, 'lap2-paper': 1.8}

Noise units: ``make_private`` takes the noise under the keyword of the mechanism's unit
(``noise_multiplier`` sigma of C for Gaussian mechanisms, ``laplace_scale`` absolute b for Laplace
ones, ``concentration`` r for Dirichlet); ``PrivacyOptions.noise`` (a :class:`TrainingConfig`'s
``privacy.noise``) is in that same unit.

The names of ``__all__`` are imported from their modules on first use (PEP 562), so that importing the package, or
its torch-free modules (the configuration :mod:`dpnoise.training.config`, :mod:`dpnoise.training.recipes`),
loads no torch: the command line builds its parser from the configuration's fields.
"""

from importlib import import_module
from typing import Any

#: public name -> the module of this package that defines it
_EXPORTED_FROM = {
    "BookkeepingModule": "bookkeeping",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "DataConfig": "config",
    "InvalidConfigError": "config",
    "OptimizerConfig": "config",
    "OutputConfig": "config",
    "Schedule": "config",
    "TrainingConfig": "config",
    "ExecutionOptions": "execution",
    "GRAD_SAMPLE_MODES": "execution",
    "PrivacyEngine": "engine",
    "make_private": "engine",
    "CheckpointMismatchError": "errors",
    "EngineStateError": "errors",
    "InvalidTrainingOptionError": "errors",
    "PrivacyBudgetExceededError": "errors",
    "UnsupportedLayerError": "errors",
    "UnkeyedCheckpointWarning": "errors",
    "PerExampleCheckError": "errors",
    "StepMetrics": "loop",
    "endless_batches": "loop",
    "evaluate_accuracy": "loop",
    "train_step": "loop",
    "train_steps": "loop",
    "causal_lm_loss": "losses",
    "per_sequence_causal_lm_losses": "losses",
    "NoisyGradientOptimizer": "optimizers",
    "OutputPrivateOptimizer": "optimizers",
    "PerExampleCheckReport": "per_example_check",
    "check_per_example": "per_example_check",
    "verify_per_example_gradients": "per_example_check",
    "PrivacyOptions": "privacy_plan",
    "PrivacyPlan": "privacy_plan",
    "PrivacySetup": "privacy_plan",
    "resolve": "privacy_plan",
    "StepLedger": "step_ledger",
    "train_private": "pipeline",
    "TrainingResult": "summary",
}

__all__ = sorted(_EXPORTED_FROM)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTED_FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_EXPORTED_FROM[name]}"), name)
    globals()[name] = value  # the next use does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
