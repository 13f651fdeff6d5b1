"""The torch registry: every registered mechanism that can run, and a clear refusal for one that cannot."""

from dataclasses import replace

import pytest

from dpnoise.accounting import MECHANISMS as SPECS
from dpnoise.accounting.mechanisms import LAPLACE_SCALE, NOISE_MULTIPLIER
from dpnoise.mechanisms import RUNNABLE_MECHANISMS, InvalidMechanismError, get_mechanism, laplace_noise


def test_every_registered_mechanism_runs_gradient_ones_by_their_noise_law():
    assert list(RUNNABLE_MECHANISMS) == list(SPECS)
    assert get_mechanism("lap2").sample_noise is laplace_noise
    assert get_mechanism("dirichlet").wrap_module is not None


@pytest.mark.parametrize("base, noise, match", [
    ("lap2", NOISE_MULTIPLIER, "its noise 'noise_multiplier' .* is not in the unit of the laplace sampler"),
    ("gaussian", LAPLACE_SCALE, "its noise 'laplace_scale' .* is not in the unit of the gaussian sampler"),
])
def test_a_gradient_mechanism_whose_noise_unit_is_not_its_sampler_s_is_refused(monkeypatch, base, noise, match):
    monkeypatch.setitem(SPECS, "mismatched", replace(SPECS[base], name="mismatched", noise=noise))
    assert "mismatched" not in RUNNABLE_MECHANISMS
    with pytest.raises(InvalidMechanismError, match=f"mechanism 'mismatched' cannot run: {match}"):
        get_mechanism("mismatched")


def test_an_output_mechanism_without_its_wrapper_is_refused(monkeypatch):
    monkeypatch.setitem(SPECS, "unwrapped", replace(SPECS["dirichlet"], name="unwrapped"))
    with pytest.raises(InvalidMechanismError, match="mechanism 'unwrapped' cannot run: an output mechanism needs"):
        get_mechanism("unwrapped")
