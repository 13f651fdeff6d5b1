"""ExecutionOptions: checked when built (errors name the option); make_private_with_options is the
keyword make_private with its options as the two dataclasses."""

import warnings

import pytest
import torch

from dpnoise.training import ExecutionOptions, InvalidTrainingOptionError, PrivacyEngine, PrivacyOptions
from training_helpers import digits_loader, mlp


@pytest.mark.parametrize("options, match", [
    (dict(grad_sample_mode="fast"), "grad_sample_mode must be one of auto, bookkeeping, hooks, got 'fast'"),
    (dict(noise_shares="all"), "noise_shares must be one of split, rank0, got 'all'"),
    (dict(max_physical_batch_size=0), "max_physical_batch_size"),
    (dict(max_physical_batch_size=8, poisson_sampling=False), "max_physical_batch_size splits Poisson batches"),
    (dict(poisson_sampling="yes"), "poisson_sampling must be True or False"),
])
def test_bad_execution_options_are_refused_by_name(options, match):
    with pytest.raises((InvalidTrainingOptionError, ValueError), match=match):
        ExecutionOptions(**options)


def one_run(digits_train, with_options: bool):
    model = mlp(hidden=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = digits_loader(digits_train, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the noise seed's warning
        engine = PrivacyEngine(seed=0, noise_seed=0)
        if with_options:
            model, optimizer, loader = engine.make_private_with_options(
                model, optimizer, loader, privacy=PrivacyOptions(mechanism="lap2", delta=1e-5, target_epsilon=2.0, epochs=1),
                execution=ExecutionOptions(max_physical_batch_size=16))
        else:
            model, optimizer, loader = engine.make_private(model, optimizer, loader, mechanism="lap2", delta=1e-5,
                                                           target_epsilon=2.0, epochs=1, max_physical_batch_size=16)
    for _, (x, y) in zip(range(4), loader):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()], engine.epsilon_by_accountant(), engine.setup


def test_make_private_with_options_is_the_keyword_form(digits_train):
    (params, epsilons, setup), (keyword_params, keyword_epsilons, keyword_setup) = (
        one_run(digits_train, True), one_run(digits_train, False))
    assert setup == keyword_setup and epsilons == keyword_epsilons
    assert all(torch.equal(a, b) for a, b in zip(params, keyword_params))
