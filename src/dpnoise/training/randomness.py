"""The run's private randomness: the Poisson sampling and the noise, which no one may know.

The privacy of DP-SGD rests on two secrets: which examples each step sampled (the amplification
by subsampling that every accountant assumes) and the noise that was added.  Anyone who can
regenerate both can subtract the noise from a released intermediate model, and the printed
epsilon then protects nothing.  So by default both are drawn from generators seeded from the
operating system's entropy (:func:`secrets.randbits`), separately on every rank, and their seeds
are never stored: not in the engine, the records or the checkpoints.  A resumed run draws fresh
seeds.  The public ``seed`` of a run drives model initialisation and data-loader workers only.

A reproducible private stream exists only on explicit request (``noise_seed``; the reproductions
use it for bit-identical re-runs), with :class:`ReproducibleNoiseWarning`.  Its checkpoints carry
the generators' states, each bound to the noise seed by a tag (SHA-256 of the seed, the rank, the
generator's name and its state): a state replaced by another one (e.g. a freshly seeded
generator) is refused on resume.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Optional

import torch

#: How a run's private randomness is seeded, as recorded in checkpoints and records.
SECRET = "secret"
FROM_NOISE_SEED = "noise_seed"


class ReproducibleNoiseWarning(UserWarning):
    """The private randomness (noise and sampling) comes from a seed someone knows."""


def reproducible_noise_warning(noise_seed: int) -> str:
    return (f"noise_seed={noise_seed}: the noise and the Poisson sampling are reproducible, so anyone who knows "
            "this seed can regenerate them and remove the noise from any released model; the epsilon holds only "
            "while the seed stays secret. Omit noise_seed for secret randomness (the default).")


def private_master_seed(noise_seed: Optional[int]) -> int:
    """The seed the private generators derive from: ``noise_seed``, or 63 bits of OS entropy."""
    return secrets.randbits(63) if noise_seed is None else int(noise_seed)


def randomness_source(noise_seed: Optional[int]) -> str:
    return SECRET if noise_seed is None else FROM_NOISE_SEED


def generator_state_tag(noise_seed: int, rank: int, name: str, state: torch.Tensor) -> str:
    """SHA-256 binding a saved generator ``state`` to the run's noise seed, rank and generator name."""
    digest = hashlib.sha256(f"dpnoise generator|{int(noise_seed)}|{rank}|{name}|".encode())
    digest.update(state.cpu().numpy().tobytes())
    return digest.hexdigest()
