"""The step signal-to-noise diagnostic: clipped sums, coherence and noise standard deviations."""

from __future__ import annotations

import math

import pytest
import torch

from reproductions.tools.step_snr import (clipped_gradient_sum, coherence, initial_state_key, main, noise_std,
                                         step_snr)


def squared_distance_losses(weight: torch.Tensor, targets: list[list[float]]):
    """Losses whose gradients in ``weight`` are ``2 (weight - target)``, one per target."""
    return (((weight - torch.tensor(t)) ** 2).sum() for t in targets)


def test_identical_gradients_are_fully_coherent_and_opposite_ones_cancel():
    weight = torch.zeros(3, requires_grad=True)
    norms, same = clipped_gradient_sum(squared_distance_losses(weight, [[3.0, 4.0, 0.0]] * 4), [weight], clip=0.5)
    assert norms == pytest.approx([10.0] * 4)
    assert coherence(same, 4, 0.5) == pytest.approx(1.0)
    _, opposite = clipped_gradient_sum(squared_distance_losses(weight, [[3.0, 4.0, 0.0], [-3.0, -4.0, 0.0]]),
                                       [weight], clip=0.5)
    assert opposite == pytest.approx(0.0, abs=1e-6)  # float32 gradients


def test_gradients_below_the_clipping_norm_are_summed_unscaled():
    weight = torch.zeros(2, requires_grad=True)
    # gradients (0.2, 0) unclipped and (0, 10) clipped to (0, 1)
    _, total = clipped_gradient_sum(squared_distance_losses(weight, [[-0.1, 0.0], [0.0, -5.0]]), [weight], clip=1.0)
    assert total == pytest.approx(math.hypot(0.2, 1.0))


def test_noise_std_is_sigma_c_for_gaussian_and_sqrt2_b_for_laplace():
    assert noise_std("gaussian", 0.5, 0.1) == pytest.approx(0.05)
    assert noise_std("lap2", 0.05, 0.1) == pytest.approx(0.05 * math.sqrt(2))
    with pytest.raises(ValueError, match="mechanism"):
        noise_std("laplace-l1", 0.05, 0.1)


def test_a_signal_as_long_as_the_expected_noise_has_snr_one():
    assert step_snr(0.05 * math.sqrt(10_000), 0.05, 10_000) == pytest.approx(1.0)


def test_runs_share_a_clipped_sum_only_when_they_differ_in_their_noise_alone():
    record = dict(experiment="finetune-full", dataset="sst2", model="minilm", mechanism="gaussian",
                  calibrated_with="gaussian", target_epsilon=3.74, seed=0, steps=300, batch_size=128, clip=0.1,
                  trainable="lora", max_length=32)
    lap2_longer = dict(record, mechanism="lap2", calibrated_with="lap2", target_epsilon=0.54, steps=900)
    assert initial_state_key(lap2_longer) == initial_state_key(record)
    for field, value in [("max_length", 64), ("trainable", "all"), ("seed", 1), ("clip", 1.0)]:
        assert initial_state_key(dict(record, **{field: value})) != initial_state_key(record), field


def test_a_batch_below_one_is_refused_naming_the_option(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["--experiment", "finetune-full", "--results-dir", str(tmp_path), "--batch", "0"])
    assert exit_info.value.code == 2
    assert "--batch" in capsys.readouterr().err
