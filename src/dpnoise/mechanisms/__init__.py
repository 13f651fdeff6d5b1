"""Torch privacy mechanisms: per-example clipping, noise samplers, Dirichlet and penultimate outputs.

See :mod:`dpnoise.mechanisms.registry` for the list of training mechanisms and their noise units.
"""

from dpnoise.mechanisms.clipping import clip_factors, clipped_sum, per_example_norms
from dpnoise.mechanisms.dirichlet import (
    DirichletOutput,
    dirichlet_learning_rate,
    dirichlet_log_sample,
    dirichlet_nll,
    kappa,
)
from dpnoise.mechanisms.errors import InvalidMechanismError
from dpnoise.mechanisms.noise import gaussian_noise, laplace_noise
from dpnoise.mechanisms.penultimate import PenultimateGaussian
from dpnoise.mechanisms.registry import MECHANISMS, Mechanism, get_mechanism, register_mechanism

__all__ = [
    "MECHANISMS",
    "DirichletOutput",
    "InvalidMechanismError",
    "Mechanism",
    "PenultimateGaussian",
    "clip_factors",
    "clipped_sum",
    "dirichlet_learning_rate",
    "dirichlet_log_sample",
    "dirichlet_nll",
    "gaussian_noise",
    "get_mechanism",
    "kappa",
    "laplace_noise",
    "per_example_norms",
    "register_mechanism",
]
