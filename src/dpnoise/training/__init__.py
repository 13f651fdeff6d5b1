"""Private training: ``make_private`` / :class:`PrivacyEngine`, DP optimizers, checkpoints, a loop,
and the whole pipeline of ``dpnoise train`` as one call, :func:`train_private` (a
:class:`TrainingConfig` in, a :class:`TrainingResult` out).

>>> model, optimizer, loader = make_private(model, optimizer, loader, mechanism="lap2",
...     target_epsilon=1.0, delta=1e-5, epochs=2, max_grad_norm=1.0, seed=0)   # doctest: +SKIP
>>> optimizer.privacy_engine.epsilon_by_accountant()                          # doctest: +SKIP
{'lap2': 0.99, 'lap2-paper': 1.8}

Noise units: ``make_private`` takes the noise under the keyword of the mechanism's unit
(``noise_multiplier`` sigma of C for Gaussian mechanisms, ``laplace_scale`` absolute b for Laplace
ones, ``concentration`` r for Dirichlet); ``MechanismConfig.noise`` is in that same unit.
"""

from dpnoise.training.bookkeeping import BookkeepingModule
from dpnoise.training.checkpoint import load_checkpoint, save_checkpoint
from dpnoise.training.config import (
    DataConfig,
    InvalidConfigError,
    MechanismConfig,
    OptimizerConfig,
    OutputConfig,
    PrivacyTarget,
    Schedule,
    TrainingConfig,
)
from dpnoise.training.engine import GRAD_SAMPLE_MODES, PrivacyEngine, PrivacySetup, make_private
from dpnoise.training.errors import (
    CheckpointMismatchError,
    EngineStateError,
    InvalidTrainingOptionError,
    PrivacyBudgetExceededError,
    UnsupportedLayerError,
)
from dpnoise.training.loop import StepMetrics, endless_batches, evaluate_accuracy, train_step, train_steps
from dpnoise.training.optimizers import NoisyGradientOptimizer, OutputPrivateOptimizer
from dpnoise.training.pipeline import train_private
from dpnoise.training.summary import TrainingResult

__all__ = [
    "BookkeepingModule",
    "GRAD_SAMPLE_MODES",
    "CheckpointMismatchError",
    "DataConfig",
    "EngineStateError",
    "InvalidConfigError",
    "InvalidTrainingOptionError",
    "MechanismConfig",
    "NoisyGradientOptimizer",
    "OptimizerConfig",
    "OutputConfig",
    "OutputPrivateOptimizer",
    "PrivacyBudgetExceededError",
    "PrivacyEngine",
    "PrivacySetup",
    "PrivacyTarget",
    "Schedule",
    "StepMetrics",
    "TrainingConfig",
    "TrainingResult",
    "UnsupportedLayerError",
    "endless_batches",
    "evaluate_accuracy",
    "load_checkpoint",
    "make_private",
    "save_checkpoint",
    "train_private",
    "train_step",
    "train_steps",
]
