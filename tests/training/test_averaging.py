"""The parameter average (EMA with warm-up) and the learning-rate schedule of a run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dpnoise.training import OptimizerConfig, train_private
from dpnoise.training.averaging import learning_rate_schedule, parameter_average, warmed_up_decay

from test_pipeline import TINY, with_field


def test_warm_up_reaches_the_decay():
    assert warmed_up_decay(0.999, 0) == pytest.approx(0.1)
    assert warmed_up_decay(0.999, 10) == pytest.approx(11 / 20)
    assert warmed_up_decay(0.9, 10_000) == 0.9


def test_average_is_the_warmed_up_exponential_moving_average():
    model = torch.nn.Linear(3, 2)
    average = parameter_average(model, decay=0.5)
    iterates = [torch.full_like(model.weight, float(k)) for k in range(1, 5)]
    expected = None
    for t, iterate in enumerate(iterates):
        with torch.no_grad():
            model.weight.copy_(iterate)
        average.update_parameters(model)
        # the first update copies; update t > 0 weighs the average by min(0.5, (1 + (t)) / (10 + t))
        expected = iterate if expected is None else expected * warmed_up_decay(0.5, t) + iterate * (1 - warmed_up_decay(0.5, t))
    torch.testing.assert_close(average.module.weight, expected)


def test_cosine_schedule_decays_to_zero_over_the_steps():
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=2.0)
    schedule = learning_rate_schedule(optimizer, "cosine", steps=10)
    lrs = []
    for _ in range(10):
        optimizer.step()
        schedule.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs[4] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert learning_rate_schedule(optimizer, "constant", steps=10) is None


def test_run_with_average_and_schedule_reports_them():
    config = dataclasses.replace(TINY, optimizer=OptimizerConfig(name="sgd", lr=0.5, momentum=0.9, lr_schedule="cosine",
                                                                 ema_decay=0.9))
    summary = train_private(config).summary()
    assert summary["lr"] == 0.5  # the lr before the schedule
    assert (summary["momentum"], summary["lr_schedule"], summary["ema_decay"]) == (0.9, "cosine", 0.9)
    assert "physical_batch_size" not in summary  # a default is left out
    assert 0.0 <= summary["test_accuracy"] <= 1.0


@pytest.mark.parametrize("path, value, message", [
    ("optimizer.ema_decay", 1.0, r"optimizer.ema_decay must be in \(0, 1\)"),
    ("optimizer.lr_schedule", "step", "optimizer.lr_schedule must be one of constant, cosine"),
    ("execution.max_physical_batch_size", 0, "execution.max_physical_batch_size must be"),
])
def test_bad_recipe_fields_are_refused_by_name(path, value, message):
    from dpnoise.training import InvalidConfigError

    with pytest.raises(InvalidConfigError, match=message):
        train_private(with_field(TINY, path, value))
