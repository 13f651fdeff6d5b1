"""to_argv: a configuration written as dpnoise train's flags builds the same configuration."""

from pathlib import Path

import pytest

from dpnoise.cli.main import build_parser
from dpnoise.cli.train import configuration_fields
from dpnoise.training.config import OPTIONS, TrainingConfig, non_default_fields, to_argv

REQUIRED = {"data.name": "digits", "privacy.mechanism": "gaussian", "privacy.delta": 1e-5, "privacy.epochs": 2.0,
            "schedule.batch_size": 64}

CONFIGS = [
    {"privacy.noise": 2.0},
    {"privacy.noise": 1.1, "privacy.max_grad_norm": 0.1 + 0.2},  # a float that is not its short decimal
    {"privacy.target_epsilon": 3.0, "privacy.calibrate_with": "gaussian-rdp", "privacy.accountant": "gaussian-pld"},
    {"privacy.noise": 1.0, "privacy.secure_mode": True, "execution.per_example_check": False,
     "output.progress": False, "output.log_private_batch_stats": True},
    {"privacy.mechanism": "dirichlet", "privacy.noise": 0.3, "privacy.options": {"alpha": 2.5, "num_classes": 10}, "optimizer.name": "sgd",
     "optimizer.effective_lr": 0.05, "optimizer.momentum": 0.9},
    {"privacy.mechanism": "lap2", "privacy.noise": 0.8, "data.limit": 500, "data.test_limit": 100,
     "optimizer.lr": 1e-3, "optimizer.weight_decay": 1e-4, "optimizer.label_smoothing": 0.1,
     "optimizer.lr_schedule": "cosine", "optimizer.ema_decay": 0.99, "seed": 3, "noise_seed": 4, "threads": 1,
     "output.folder": Path("runs/a b"), "schedule.max_steps": 7, "execution.max_physical_batch_size": 16},
]


@pytest.mark.parametrize("fields", CONFIGS)
def test_the_command_line_of_a_configuration_builds_it_again(fields):
    config = TrainingConfig.from_fields({**REQUIRED, **fields})
    argv = to_argv(config)
    parsed = TrainingConfig.from_fields(configuration_fields(build_parser().parse_args(["train", *argv])))
    assert parsed == config
    assert set(non_default_fields(config)) >= set(fields) - {path for path, value in fields.items()
                                                             if path in OPTIONS and value == OPTIONS[path].default}


def test_only_fields_that_differ_from_their_defaults_are_written():
    config = TrainingConfig.from_fields({**REQUIRED, "privacy.noise": 1.0})
    assert to_argv(config) == ["--dataset", "digits", "--mechanism", "gaussian", "--noise", "1.0", "--delta", "1e-05",
                               "--epochs", "2.0", "--batch-size", "64"]
