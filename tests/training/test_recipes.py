"""Named recipes: published hyper-parameters as defaults that explicit values override."""

from __future__ import annotations

import pytest

from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.cli.main import build_parser
from dpnoise.cli.train import configuration_fields
from dpnoise.training import TrainingConfig
from dpnoise.training.config import check_config
from dpnoise.training.recipes import RECIPES, apply_recipe


def test_scatternet_recipe_sets_the_published_settings():
    config = TrainingConfig.from_fields(apply_recipe({"data.name": "fashion-mnist", "privacy.mechanism": "gaussian"},
                                                     "scatternet"))
    check_config(config)
    assert config.model == "scatternet-linear"
    assert (config.schedule.batch_size, config.optimizer.lr, config.privacy.epochs) == (8192, 16.0, 40)
    assert (config.optimizer.name, config.optimizer.momentum, config.privacy.max_grad_norm) == ("sgd", 0.9, 0.1)
    assert (config.privacy.target_epsilon, config.privacy.delta) == (3.0, 1e-5)


def test_explicit_values_win_and_none_means_not_given():
    fields = apply_recipe({"data.name": "mnist", "model": "scatternet-cnn", "optimizer.lr": 0.5,
                           "privacy.epochs": None}, "scatternet")
    assert fields["optimizer.lr"] == 0.5 and fields["privacy.epochs"] == 25 and fields["schedule.batch_size"] == 1024


def test_another_optimizer_than_the_recipes_drops_its_sgd_momentum():
    fields = apply_recipe({"data.name": "mnist", "privacy.mechanism": "lap2", "optimizer.name": "adam"}, "scatternet")
    assert "optimizer.momentum" not in fields
    check_config(TrainingConfig.from_fields(fields))  # adam refuses a momentum
    given = apply_recipe({"data.name": "mnist", "privacy.mechanism": "lap2", "optimizer.momentum": 0.5}, "scatternet")
    assert given["optimizer.momentum"] == 0.5 and given["optimizer.name"] == "sgd"


def test_every_recipe_entry_is_a_valid_configuration():
    for name, recipe in RECIPES.items():
        for dataset, model in recipe.by_dataset_and_model:
            fields = apply_recipe({"data.name": dataset, "model": model, "privacy.mechanism": "lap2"}, name)
            check_config(TrainingConfig.from_fields(fields))


def test_unknown_recipe_or_uncovered_dataset_is_refused_by_name():
    with pytest.raises(InvalidParameterError, match="unknown recipe 'tramer'"):
        apply_recipe({"data.name": "mnist"}, "tramer")
    with pytest.raises(InvalidParameterError, match="no settings for dataset 'digits' with model 'scatternet-linear'"):
        apply_recipe({"data.name": "digits"}, "scatternet")


def test_command_line_recipe_fills_what_is_not_given():
    args = build_parser().parse_args(["train", "--recipe", "scatternet", "--dataset", "cifar10-jpeg",
                                      "--model", "scatternet-cnn", "--mechanism", "lap2", "--epochs", "2"])
    fields = configuration_fields(args)
    assert fields["privacy.epochs"] == 2 and fields["schedule.batch_size"] == 8192 and fields["optimizer.lr"] == 4.0
    args = build_parser().parse_args(["train", "--dataset", "digits", "--mechanism", "lap2", "--epsilon", "1",
                                      "--delta", "1e-5", "--batch-size", "64"])
    with pytest.raises(InvalidParameterError, match="give --epochs"):
        configuration_fields(args)
