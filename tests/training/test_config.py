"""The configuration's fields are the one declaration of the training options (:mod:`dpnoise.training.config`):
each field's option metadata gives its flag, help, check and choices; :func:`check_config` runs the declared checks,
naming the field (and, through :meth:`InvalidConfigError.named`, the command line's flag)."""

from __future__ import annotations

import dataclasses

import pytest

from cli_refusals import refused_value
from dpnoise import checks
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.training.config import (
    OPTION_GROUPS,
    OPTIONS,
    SECTIONS,
    DataConfig,
    InvalidConfigError,
    MechanismConfig,
    PrivacyTarget,
    Schedule,
    TrainingConfig,
    check_config,
)

#: a configuration every declared check accepts; dirichlet, so that alpha and effective_lr apply
VALID = TrainingConfig(DataConfig("digits"), MechanismConfig("dirichlet"), PrivacyTarget(delta=1e-5, epsilon=1.0),
                       Schedule(epochs=1, batch_size=64))
CHECKED = [path for path, declared in OPTIONS.items() if declared.check]
OWN_CHOICES = [path for path, declared in OPTIONS.items() if declared.choices is not None and not declared.registry]


def with_field(config: TrainingConfig, path: str, value) -> TrainingConfig:
    group, _, name = path.rpartition(".")
    if not group:
        return dataclasses.replace(config, **{name: value})
    return dataclasses.replace(config, **{group: dataclasses.replace(getattr(config, group), **{name: value})})


def flags(error: InvalidConfigError) -> str:
    return error.named(lambda path: OPTIONS[path].flag)


def test_every_field_declares_its_option_once():
    paths = []
    for section in dataclasses.fields(TrainingConfig):
        kind = SECTIONS.get(section.name)
        paths += [f"{section.name}.{f.name}" for f in dataclasses.fields(kind)] if kind else [section.name]
    assert list(OPTIONS) == paths  # every field, in declaration order (the order of the checks)
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
    config = VALID
    for path in CHECKED:
        if OPTIONS[path].default is None:
            config = with_field(config, path, None)
    check_config(with_field(config, "privacy.epsilon", 1.0))


@pytest.mark.parametrize("path", OWN_CHOICES)
def test_each_declared_choice_list_refuses_another_value(path):
    declared = OPTIONS[path]
    with pytest.raises(InvalidConfigError) as caught:
        check_config(with_field(VALID, path, "no-such-choice"))
    assert str(caught.value) == f"{path} must be one of {', '.join(declared.choices)}, got 'no-such-choice'"
    assert flags(caught.value).startswith(f"{declared.flag} must be one of")
    for choice in declared.choices:
        check_config(with_field(VALID, path, choice))
