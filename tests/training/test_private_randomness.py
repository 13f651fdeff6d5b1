"""PrivateRandomness: one rank's noise and sampling generators, without an engine."""

import torch

from dpnoise.training.randomness import PrivateRandomness

CPU = torch.device("cpu")


def draws(randomness):
    return torch.rand(4, generator=randomness.noise), torch.rand(4, generator=randomness.sampling)


def test_a_noise_seed_is_saved_with_its_tags_and_restored_exactly():
    randomness = PrivateRandomness(7)
    randomness.start(CPU, rank=0, world_size=1)
    draws(randomness)
    saved = randomness.saved(rank=0)
    assert set(saved) == {"noise", "noise_tag", "sampling", "sampling_tag"}
    expected = draws(randomness)
    resumed = PrivateRandomness(7)
    resumed.start(CPU, rank=0, world_size=1)
    assert resumed.restore({"device": "cpu", "ranks": [saved]}, CPU, 0, 1, steps=1) is None
    assert all(torch.equal(a, b) for a, b in zip(draws(resumed), expected))


def test_secret_randomness_is_never_saved_and_resumes_with_fresh_draws():
    randomness = PrivateRandomness(None)
    randomness.start(CPU, rank=0, world_size=1)
    assert randomness.source == "secret" and randomness.saved(rank=0) == {}
    before = draws(randomness)
    noise = randomness.noise
    assert randomness.restore({"device": "cpu", "ranks": [{}]}, CPU, 0, 1, steps=3) is None
    assert randomness.noise is noise  # re-seeded in place: the sampler and optimizer hold it
    assert not torch.equal(draws(randomness)[0], before[0])


def test_states_from_another_kind_of_device_are_replaced_by_a_re_seeding_with_a_warning():
    randomness = PrivateRandomness(7)
    randomness.start(CPU, rank=0, world_size=1)
    warning = randomness.restore({"device": "cuda", "ranks": [{}]}, CPU, 0, 1, steps=5)
    assert "re-seeded at step 5" in warning
