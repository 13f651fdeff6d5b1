"""The mechanism registry's checks of a run's side parameters."""
import pytest

from dpnoise.accounting.mechanisms import get_mechanism_spec
from dpnoise.accounting.validation import InvalidParameterError


def test_checked_alpha_defaults_to_one_and_checks_the_value():
    dirichlet = get_mechanism_spec("dirichlet")
    assert dirichlet.checked_alpha(None) == 1.0
    assert dirichlet.checked_alpha(0.5) == 0.5
    with pytest.raises(InvalidParameterError, match="--alpha"):
        dirichlet.checked_alpha(0.0, "--alpha")


def test_checked_alpha_is_refused_by_a_mechanism_without_it():
    with pytest.raises(InvalidParameterError, match="does not take it"):
        get_mechanism_spec("gaussian").checked_alpha(1.0)
