"""The run's private randomness: the Poisson sampling and the noise, which no one may know.

The privacy of DP-SGD rests on two secrets: which examples each step sampled (the amplification
by subsampling that every accountant assumes) and the noise that was added.  Anyone who can
regenerate both can subtract the noise from a released intermediate model, and the printed
epsilon then protects nothing.  So by default both are drawn from generators seeded from the
operating system's entropy (:func:`secrets.randbits`), separately on every rank, and their seeds
are never stored: not in the engine, the records or the checkpoints.  A resumed run draws fresh
seeds.  The public ``seed`` of a run drives model initialisation and data-loader workers only.  The
generators are torch generators (Mersenne Twister), not cryptographically secure; secure mode draws
the batches and the noise from the operating system's CSPRNG.

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

from dpnoise.training.devices import seeded_generator
from dpnoise.training.distributed import generator_seeds

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


class PrivateRandomness:
    """One rank's private generators, the Poisson sampler's and the noise's: seeded from a secret master
    seed (the default) or from ``noise_seed``, re-seeded on resume, saved (with their tags) and restored."""

    #: the names the generators are saved under
    NAMES = ("noise", "sampling")

    def __init__(self, noise_seed: Optional[int]) -> None:
        #: the explicit seed (None: secret, from the OS's entropy)
        self.noise_seed = noise_seed
        self._master_seed = private_master_seed(noise_seed)
        self.noise: Optional[torch.Generator] = None
        self.sampling: Optional[torch.Generator] = None

    @property
    def source(self) -> str:
        """"secret" (seeded from the OS's entropy, the default) or "noise_seed" (reproducible)."""
        return randomness_source(self.noise_seed)

    def start(self, device: torch.device, rank: int, world_size: int, resumed_at: Optional[int] = None) -> None:
        """(Re)seed the generators on ``device`` for ``rank`` of ``world_size`` (created on first use; after a resume
        at step ``resumed_at``, secret randomness draws a fresh secret master seed)."""
        if resumed_at is not None and self.noise_seed is None:
            self._master_seed = private_master_seed(None)
        noise_seed, sampling_seed, _ = generator_seeds(self._master_seed, rank, world_size, resumed_at)
        if self.noise is None:
            self.noise, self.sampling = seeded_generator(noise_seed, device), seeded_generator(sampling_seed, device)
        else:  # in place: the sampler and the optimizer hold these generators
            self.noise.manual_seed(noise_seed)
            self.sampling.manual_seed(sampling_seed)

    def saved(self, rank: int) -> dict[str, torch.Tensor | str]:
        """The generators' states with their tags (empty for secret randomness, which is never saved)."""
        if self.noise_seed is None:
            return {}
        own: dict[str, torch.Tensor | str] = {}
        for name in self.NAMES:
            own[name] = getattr(self, name).get_state()
            own[f"{name}_tag"] = generator_state_tag(self.noise_seed, rank, name, own[name])
        return own

    def restore(self, generators: dict, device: torch.device, rank: int, world_size: int, steps: int) -> Optional[str]:
        """Continue from a checkpoint's ``generators`` (already checked) at step ``steps``: this rank's saved states
        where they were saved on this kind of device, else re-seeded generators, with the warning to give."""
        if self.noise_seed is not None and generators["device"] == device.type:
            own = generators["ranks"][rank]
            for name in self.NAMES:
                getattr(self, name).set_state(own[name])
            return None
        self.start(device, rank, world_size, resumed_at=steps)
        if self.noise_seed is None:
            return None
        return (f"the checkpoint was written on {generators['device']} and this run is on {device.type}: the noise "
                f"and sampling generators are re-seeded at step {steps} (fresh draws; the run does not repeat the "
                f"draws an uninterrupted run would have made)")

