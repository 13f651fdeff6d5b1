"""Private training: ``make_private`` / :class:`PrivacyEngine`, DP optimizers, checkpoints, a loop.

>>> model, optimizer, loader = make_private(model, optimizer, loader, mechanism="lap2",
...     target_epsilon=1.0, delta=1e-5, epochs=2, max_grad_norm=1.0, seed=0)   # doctest: +SKIP
>>> optimizer.privacy_engine.epsilon_by_accountant()                          # doctest: +SKIP
{'lap2': 0.99, 'lap2-paper': 1.8}

Noise units (``noise=``): Gaussian sigma multiplies C; Laplace (``lap2``, ``laplace-l1``) b is the
absolute scale on the sum of clipped gradients; Dirichlet r; penultimate-gaussian sigma of C.
"""

from dpnoise.training.bookkeeping import BookkeepingModule
from dpnoise.training.checkpoint import load_checkpoint, save_checkpoint
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

__all__ = [
    "BookkeepingModule",
    "GRAD_SAMPLE_MODES",
    "CheckpointMismatchError",
    "EngineStateError",
    "InvalidTrainingOptionError",
    "NoisyGradientOptimizer",
    "OutputPrivateOptimizer",
    "PrivacyBudgetExceededError",
    "PrivacyEngine",
    "PrivacySetup",
    "StepMetrics",
    "UnsupportedLayerError",
    "endless_batches",
    "evaluate_accuracy",
    "load_checkpoint",
    "make_private",
    "save_checkpoint",
    "train_step",
    "train_steps",
]
