"""The configuration's fields are the one declaration of the training options (:mod:`dpnoise.training.config`):
each field's option metadata gives its flag, help, check and choices; :meth:`TrainingConfig.from_fields` and
:func:`check_config` run the declared checks, naming the field (and, through :meth:`InvalidConfigError.named`, the
command line's flag).  The privacy and execution sections are ``make_private``'s own option classes."""

from __future__ import annotations

import dataclasses

import pytest

from cli_refusals import refused_value
from dpnoise import checks
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.training import ExecutionOptions, PrivacyOptions
from dpnoise.training.config import (
    OPTIONS,
    SECTIONS,
    DataConfig,
    InvalidConfigError,
    Schedule,
    TrainingConfig,
    check_config,
    field_value,
)
from dpnoise.training.options import OPTION_GROUPS

#: a configuration every declared check accepts; dirichlet, so that alpha and effective_lr apply
VALID = TrainingConfig(DataConfig("digits"), PrivacyOptions(mechanism="dirichlet", delta=1e-5, target_epsilon=1.0,
                                                            epochs=1), Schedule(batch_size=64))
CHECKED = [path for path, declared in OPTIONS.items() if declared.check]
OWN_CHOICES = [path for path, declared in OPTIONS.items() if declared.choices is not None and not declared.registry]
#: the fields without a command-line flag: set by the training run, derived, or not offered by ``dpnoise train``
#: ``privacy.options`` has one generated flag per mechanism option instead (tested in tests/cli)
WITHOUT_FLAG = {"privacy.options", "privacy.data_releases", "privacy.on_budget_exhausted", "privacy.primary",
                "privacy.accountants", "execution.poisson_sampling"}


def with_field(config: TrainingConfig, path: str, value) -> TrainingConfig:
    """``config`` with the field at ``path`` replaced, built from its dotted fields (checked by name)."""
    return TrainingConfig.from_fields({**{p: field_value(config, p) for p in OPTIONS}, path: value})


def flags(error: InvalidConfigError) -> str:
    return error.named(lambda path: OPTIONS[path].flag)


def test_every_field_declares_its_option_once():
    paths = []
    for section in dataclasses.fields(TrainingConfig):
        kind = SECTIONS.get(section.name)
        paths += [f"{section.name}.{f.name}" for f in dataclasses.fields(kind)] if kind else [section.name]
    assert list(OPTIONS) == [path for path in paths if path not in WITHOUT_FLAG]  # in declaration order
    assert len({declared.flag for declared in OPTIONS.values()}) == len(OPTIONS)
    for path, declared in OPTIONS.items():
        assert declared.path == path and declared.flag.startswith("--") and declared.help, path
        assert declared.group in OPTION_GROUPS, path
        assert not declared.check or callable(getattr(checks, declared.check[0])), path
        assert declared.registry is None or declared.choices, path  # the command line's copy of the registry
        if declared.choices is not None and declared.default not in (None, dataclasses.MISSING):
            assert declared.default in declared.choices, path


@pytest.mark.parametrize("path", CHECKED)
def test_each_declared_check_refuses_a_bad_value_naming_the_field(path, tmp_path):
    declared = OPTIONS[path]
    bad = refused_value(declared.check, tmp_path)
    with pytest.raises(InvalidConfigError) as caught:
        check_config(with_field(VALID, path, bad))
    with pytest.raises(InvalidParameterError) as direct:  # the check itself, under the field's name
        getattr(checks, declared.check[0])(path, bad, *declared.check[1:])
    assert str(caught.value) == str(direct.value) and str(caught.value).startswith(path)
    assert flags(caught.value) == str(direct.value).replace(path, declared.flag, 1)


@pytest.mark.parametrize("path", [p for p in CHECKED if OPTIONS[p].default is not None])
def test_none_is_refused_where_it_is_not_the_default(path):
    with pytest.raises(InvalidConfigError, match=f"^{path} must be"):
        check_config(with_field(VALID, path, None))


def test_none_means_not_given_where_it_is_the_default():
    not_given = {path: None for path in CHECKED if OPTIONS[path].default is None}
    config = TrainingConfig.from_fields({**{p: field_value(VALID, p) for p in OPTIONS}, **not_given,
                                         "privacy.target_epsilon": 1.0})
    check_config(config)
    assert all(field_value(config, path) is None for path in not_given.keys() - {"privacy.target_epsilon"})


@pytest.mark.parametrize("path", OWN_CHOICES)
def test_each_declared_choice_list_refuses_another_value(path):
    declared = OPTIONS[path]
    with pytest.raises(InvalidConfigError) as caught:
        check_config(with_field(VALID, path, "no-such-choice"))
    assert str(caught.value) == f"{path} must be one of {', '.join(declared.choices)}, got 'no-such-choice'"
    assert flags(caught.value).startswith(f"{declared.flag} must be one of")
    gradient = with_field(VALID, "privacy.mechanism", "gaussian")  # every choice applies to a gradient mechanism
    if path == "privacy.quantile_noise_law":  # ... and adaptive clipping's count noise to lap2's adaptive clipping
        gradient = with_field(with_field(gradient, "privacy.mechanism", "lap2"), "privacy.clipping", "adaptive")
    for choice in declared.choices:
        check_config(with_field(gradient, path, choice))


def test_the_privacy_and_execution_sections_are_the_options_of_make_private():
    assert SECTIONS["privacy"] is PrivacyOptions and SECTIONS["execution"] is ExecutionOptions
    assert isinstance(VALID.privacy, PrivacyOptions) and VALID.execution == ExecutionOptions()
    assert VALID.privacy.options.alpha == 1.0 and VALID.privacy.primary == "dirichlet"  # checked and completed when built


def test_a_section_built_directly_names_its_option_and_check_config_names_the_field():
    with pytest.raises(InvalidParameterError, match="^max_grad_norm must be finite and > 0"):
        dataclasses.replace(VALID.privacy, max_grad_norm=0.0)  # PrivacyOptions: the option's own name
    with pytest.raises(InvalidConfigError, match="^privacy.max_grad_norm must be finite and > 0"):
        with_field(VALID, "privacy.max_grad_norm", 0.0)  # from dotted fields: checked before it is built
    with pytest.raises(InvalidConfigError, match="^data.limit must be"):
        check_config(dataclasses.replace(VALID, data=DataConfig("digits", limit=0)))
    with pytest.raises(InvalidConfigError, match="^privacy.epochs must be a real number, got None"):
        check_config(dataclasses.replace(VALID, privacy=PrivacyOptions(mechanism="dirichlet", delta=1e-5, noise=1.0)))


@pytest.mark.parametrize("values,message", [
    ({"privacy.options": {"alpha": 2.0}, "privacy.mechanism": "lap2"},
     "privacy.options.alpha does not apply to mechanism 'lap2' \\(only to dirichlet\\)"),
    ({"privacy.options": {"alpha": 0.0}}, "privacy.options.alpha must be finite and > 0"),
    ({"privacy.mechanism": "laplace"}, "privacy.mechanism must be one of"),
    ({"privacy.epochs": dataclasses.MISSING}, "give privacy.epochs"),
])
def test_from_fields_refuses_what_the_privacy_options_would_refuse_naming_the_fields(values, message):
    fields = {**{p: field_value(VALID, p) for p in OPTIONS}, **values}
    with pytest.raises(InvalidConfigError, match=f"^{message}"):
        TrainingConfig.from_fields({path: value for path, value in fields.items() if value is not dataclasses.MISSING})
