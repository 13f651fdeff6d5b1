"""Privacy units larger than one example: units Poisson-sampled whole, each unit's gradient (the sum of its
examples') clipped as one, against unit-at-a-time autograd; the accountants unchanged at the unit rate; bad
keys refused; and a canary audit whose canary is one user's many examples."""

import copy
import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.accounting import InvalidParameterError, get_accountant, training_step_event
from dpnoise.training import InvalidTrainingOptionError, make_private
from dpnoise.training.per_example_gradients import UnitGrouping
from dpnoise.training.privacy_units import PrivacyUnits
from dpnoise.training.sampling import PoissonShardSampler
from per_example_reference import single_example_gradients

VOCABULARY, LENGTH, CLASSES = 20, 5, 3


class TokenModel(nn.Module):
    """Embedding, a Linear map on every token (rows of a sequence), LayerNorm, a head on the mean token."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, 6)
        self.token_map = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, ids):
        return self.head(self.norm(torch.tanh(self.token_map(self.embed(ids)))).mean(1))


def token_data(size: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randint(0, VOCABULARY, (size, LENGTH), generator=generator),
                         torch.randint(0, CLASSES, (size,), generator=generator))


def quiet_make_private(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_private(*args, **kwargs)


def test_a_grouping_puts_each_units_examples_side_by_side():
    units = UnitGrouping.of(torch.tensor([7, 3, 7, 9, 7, 3]))
    assert units.count == 3 and units.size == 3
    assert units.of_example.tolist() == [1, 0, 1, 2, 1, 0] and units.slot.tolist() == [0, 0, 1, 0, 2, 1]
    rows = torch.arange(6.0).view(6, 1, 1)
    grouped = units.side_by_side(rows).view(3, 3)
    assert grouped.tolist() == [[1, 5, 0], [0, 2, 4], [3, 0, 0]]
    assert units.summed(torch.arange(6.0)).tolist() == [6.0, 6.0, 3.0]


@pytest.mark.parametrize("mechanism,noise", [("gaussian", {"noise_multiplier": 1e-9}),
                                             ("laplace-l1", {"laplace_scale": 1e-9})])
@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_the_step_is_the_sum_of_each_units_clipped_gradient(mechanism, noise, grad_sample_mode):
    torch.manual_seed(0)
    model = TokenModel()
    reference = copy.deepcopy(model)
    data = token_data(60)
    users = [i % 7 if i < 40 else 7 + i % 3 for i in range(60)]  # 10 users of 3 to 8 examples
    module, optimizer, loader = quiet_make_private(
        model, torch.optim.SGD(model.parameters(), lr=1.0), DataLoader(data, batch_size=5), mechanism=mechanism,
        delta=1e-5, max_grad_norm=0.05, seed=0, noise_seed=3, grad_sample_mode=grad_sample_mode, privacy_unit=users,
        **noise)
    engine = optimizer.privacy_engine
    assert engine.setup.privacy_units == 10 and engine.setup.sample_rate == pytest.approx(0.5)
    batches = iter(loader)
    x, y = next(batches)
    while len(x) < 2:
        x, y = next(batches)
    batch_users = torch.tensor(users)[engine.logical_batches.last.indices]
    assert all((batch_users == user).sum() == users.count(user) for user in batch_users.tolist())  # whole units
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    nn.functional.cross_entropy(module(x), y).backward()
    optimizer.step()

    grads = single_example_gradients(reference, x, y)
    in_unit = torch.stack([batch_users == user for user in batch_users.unique()]).double()  # (units, examples)
    unit_grads = [torch.einsum("ue,e...->u...", in_unit.to(g.dtype), g) for g in grads]
    norms = torch.cat([g.reshape(len(g), -1) for g in unit_grads], 1).norm(1 if mechanism == "laplace-l1" else 2, dim=1)
    assert torch.all(norms > 0.05)  # every unit is clipped: a per-example clipping would give another sum
    factors = (0.05 / (norms + 1e-6)).clamp(max=1.0)
    for old, new, g in zip(before, model.parameters(), unit_grads):
        expected = torch.einsum("u,u...->...", factors.to(g.dtype), g) / (0.5 * 60)  # the expected examples q N
        torch.testing.assert_close(old - new, expected, rtol=1e-4, atol=1e-6)


def test_units_are_sampled_whole_at_the_unit_rate():
    assert PrivacyUnits(["a", "b", "a", "c", "b", "a"] * 50, 300).count == 3
    units = PrivacyUnits([i // 3 for i in range(300)], 300)  # 100 units of 3 examples
    sampler = PoissonShardSampler(torch.arange(300), 0.2, torch.Generator().manual_seed(0), steps=400, units=units)
    sizes = []
    for batch in sampler:
        members = units.of_example[batch.indices]
        assert all(int((members == unit).sum()) == 3 for unit in members.unique())
        sizes.append(len(members.unique()))
    mean = sum(sizes) / len(sizes)
    assert abs(mean - 20) < 4 * math.sqrt(100 * 0.2 * 0.8 / len(sizes))  # Binomial(100, 0.2) units per batch


def test_the_epsilon_is_the_accountants_at_the_unit_rate():
    data = token_data(60)
    model = TokenModel()
    _, optimizer, loader = quiet_make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=3), mechanism="gaussian",
        noise_multiplier=1.2, delta=1e-5, seed=0, privacy_unit=[i // 4 for i in range(60)])  # 15 units of 4
    engine = optimizer.privacy_engine
    for _ in range(4):
        engine.record_step()
    accountant = get_accountant("gaussian").compose(
        training_step_event("gaussian", sample_rate=3 / 15, noise=1.2), 4)
    assert engine.get_epsilon() == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)


@pytest.mark.parametrize("keys,message", [
    ([0] * 59, "privacy_unit has 59 keys but the data set has 60"),
    ([0] * 30 + [None] + [1] * 29, "example 30 has no key"),
    ([0.0] * 30 + [float("nan")] + [1.0] * 29, "example 30 has no key"),
    ([[0]] * 60, "not hashable"),
    ("users", "a sequence of one key per example"),
])
def test_bad_keys_are_refused_naming_the_example(keys, message):
    model = TokenModel()
    with pytest.raises(InvalidTrainingOptionError, match=message):
        quiet_make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(token_data(60), batch_size=3),
                           mechanism="gaussian", noise_multiplier=1.0, delta=1e-5, seed=0, privacy_unit=keys)


@pytest.mark.parametrize("options,message", [
    ({"max_physical_batch_size": 4}, "a physical batch may split a unit"),
    ({"batch_size": 20}, r"batch_size / \(number of privacy units\)"),
])
def test_what_units_do_not_support_is_refused(options, message):
    model = TokenModel()
    batch_size = options.pop("batch_size", 3)
    with pytest.raises(InvalidParameterError, match=message):
        quiet_make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                           DataLoader(token_data(60), batch_size=batch_size), mechanism="gaussian",
                           noise_multiplier=1.0, delta=1e-5, seed=0, privacy_unit=[i // 6 for i in range(60)], **options)


def test_an_output_mechanism_is_refused():
    model = nn.Sequential(nn.Linear(4, 3))
    data = TensorDataset(torch.randn(30, 4), torch.randint(0, 3, (30,)))
    with pytest.raises(InvalidTrainingOptionError, match="privacy units need a gradient mechanism"):
        quiet_make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=3),
                           mechanism="dirichlet", concentration=1.0, delta=1e-5, seed=0,
                           privacy_unit=[i // 3 for i in range(30)])
