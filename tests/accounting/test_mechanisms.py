"""The mechanism registry's side parameters: each plugin's options dataclass, built from keywords or given,
checked field by field, refused by a mechanism that does not take them."""
import pytest

from dpnoise.accounting import DirichletOptions, NoOptions, RunFacts
from dpnoise.accounting.mechanisms import get_mechanism_spec, option_fields
from dpnoise.accounting.validation import InvalidParameterError


def test_dirichlet_options_default_alpha_to_one_and_check_their_fields():
    dirichlet = get_mechanism_spec("dirichlet")
    assert dirichlet.make_options() == DirichletOptions(alpha=1.0, num_classes=None)
    assert dirichlet.make_options(alpha=0.5, num_classes=None).alpha == 0.5
    with pytest.raises(InvalidParameterError, match="^--alpha must"):
        dirichlet.make_options(alpha=0.0, naming=lambda name: "--" + name)
    with pytest.raises(InvalidParameterError, match="num_classes"):
        dirichlet.make_options(num_classes=1)
    with pytest.raises(InvalidParameterError, match="num_classes"):
        DirichletOptions(num_classes=True)


def test_an_option_is_refused_by_a_mechanism_without_it_naming_those_that_take_it():
    with pytest.raises(InvalidParameterError, match=r"alpha does not apply to mechanism 'gaussian' \(only to dirichlet"):
        get_mechanism_spec("gaussian").make_options(alpha=1.0)
    with pytest.raises(InvalidParameterError, match="takes options of type NoOptions"):
        get_mechanism_spec("gaussian").make_options(DirichletOptions())
    with pytest.raises(InvalidParameterError, match="not both"):
        get_mechanism_spec("dirichlet").make_options(DirichletOptions(), alpha=2.0)


def test_the_event_is_built_from_noise_options_and_run_facts():
    dirichlet, lap2 = get_mechanism_spec("dirichlet"), get_mechanism_spec("lap2")
    event = dirichlet.build_event(0.3, DirichletOptions(alpha=2.0, num_classes=2))
    assert (event.r, event.alpha, event.num_classes) == (0.3, 2.0, 2)
    assert lap2.build_event(0.5, NoOptions(), RunFacts(clip=2.0, params=7)).noise_multiplier == 0.25
    with pytest.raises(InvalidParameterError, match="params"):
        lap2.build_event(0.5)
    for bad in ({"clip": 0.0}, {"clip": float("nan")}, {"params": 0}, {"params": 2.5}):
        with pytest.raises(InvalidParameterError, match=next(iter(bad))):
            RunFacts(**bad)


def test_option_fields_give_each_option_once_with_its_flag_type_and_mechanisms():
    fields = option_fields()
    assert (fields["alpha"].flag, fields["alpha"].type, fields["alpha"].mechanisms) == ("--alpha", float, ("dirichlet",))
    assert (fields["num_classes"].flag, fields["num_classes"].type) == ("--classes", int)
