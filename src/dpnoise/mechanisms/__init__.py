"""Torch privacy mechanisms: per-example clipping, noise samplers, Dirichlet and penultimate outputs.

What each mechanism is (noise unit, accountants) is registered in :data:`dpnoise.accounting.MECHANISMS`;
:mod:`dpnoise.mechanisms.registry` lists the ones that can run: a gradient mechanism by its noise law,
an output mechanism by the module wrapper its own module here attaches (:func:`implement_mechanism`).
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
from dpnoise.mechanisms.registry import (
    RUNNABLE_MECHANISMS,
    Mechanism,
    get_mechanism,
    implement_mechanism,
    unimplement_mechanism,
)

__all__ = [
    "RUNNABLE_MECHANISMS",
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
    "implement_mechanism",
    "unimplement_mechanism",
    "kappa",
    "laplace_noise",
    "per_example_norms",
]
