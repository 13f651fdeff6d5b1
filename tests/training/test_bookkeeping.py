"""Book-keeping clipping equals clipping of exact per-example gradients (one example at a time)."""

import pytest
import torch
from opacus import GradSampleModule
from torch import nn
from torch.nn import functional as F

from dpnoise.accounting import noise_keywords
from dpnoise.mechanisms import per_example_norms
from dpnoise.models import build_model
from dpnoise.training import make_private
from dpnoise.training.bookkeeping import (
    CONV_WEIGHT_PERMUTATION,
    BookkeepingModule,
    conv2d_per_example_gradients,
    factorised_clipped_sum,
    factorised_norms,
    unsupported_bookkeeping_layers,
)
from dpnoise.training.errors import GradientSourceWarning
from dpnoise.training.grad_samplers import ExactGradSampleModule

from per_example_reference import single_example_gradients
from training_helpers import digits_loader, mlp


@pytest.mark.parametrize("norm_ord", [1, 2])
@pytest.mark.parametrize("with_bias", [True, False])
def test_factorised_norms_equal_norms_of_materialised_outer_products(norm_ord, with_bias):
    torch.manual_seed(0)
    activations, backprops = torch.randn(7, 5), torch.randn(7, 3)
    per_example = [torch.einsum("ij,ik->ijk", backprops, activations)] + ([backprops] if with_bias else [])
    torch.testing.assert_close(
        factorised_norms(activations, backprops, norm_ord, with_bias), per_example_norms(per_example, norm_ord)
    )


def test_factorised_clipped_sum_weights_each_outer_product():
    torch.manual_seed(1)
    activations, backprops, factors = torch.randn(6, 4), torch.randn(6, 2), torch.rand(6)
    weight_sum, bias_sum = factorised_clipped_sum(activations, backprops, factors)
    torch.testing.assert_close(weight_sum, torch.einsum("i,ij,ik->jk", factors, backprops, activations))
    torch.testing.assert_close(bias_sum, (factors[:, None] * backprops).sum(0))


def test_factorised_norms_reject_other_orders():
    with pytest.raises(ValueError, match="norm_ord"):
        factorised_norms(torch.ones(2, 2), torch.ones(2, 2), 3, with_bias=True)


@pytest.mark.parametrize(
    "conv, size",
    [
        (nn.Conv2d(1, 16, 8, stride=2, padding=3), (28, 28)),  # the seed CNN's layers
        (nn.Conv2d(16, 32, 4, stride=2), (13, 13)),
        (nn.Conv2d(3, 5, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1), bias=False), (9, 11)),
        (nn.Conv2d(6, 6, 5, stride=2, groups=6, bias=False), (12, 11)),  # depthwise (EfficientNet)
        (nn.Conv2d(4, 4, 1, groups=4), (5, 5)),  # a frozen BatchNorm's per-channel affine
        (nn.Conv2d(6, 9, (3, 1), padding=(1, 0), groups=3), (7, 6)),
    ],
)
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv2d_per_example_gradients_match_single_example_gradients(conv, size, channels_last):
    torch.manual_seed(4)
    x = torch.randn(3, conv.in_channels, *size)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    output = conv(x)
    backprops = torch.randn_like(output)
    weight, bias = conv2d_per_example_gradients(conv, x, backprops)
    for i in range(3):
        expected = torch.autograd.grad(conv(x[i : i + 1]), list(conv.parameters()), backprops[i : i + 1])
        torch.testing.assert_close(weight[i].permute(CONV_WEIGHT_PERMUTATION), expected[0], rtol=1e-4, atol=1e-5)
        if conv.bias is not None:
            torch.testing.assert_close(bias[i], expected[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm_ord", [1, 2])
@pytest.mark.parametrize(
    "name, shape", [("cnn", (1, 28, 28)), ("resnet-gn-small", (3, 32, 32)), ("mlp", (1, 8, 8))]
)
def test_norms_and_clipped_sums_match_single_example_gradients(name, shape, norm_ord):
    """Dense layers factorised, convolutions and GroupNorm materialised: all exact."""
    torch.manual_seed(0)
    model = mlp(hidden=16) if name == "mlp" else build_model(name)
    x, y = torch.randn(5, *shape) * 3, torch.tensor([0, 1, 2, 3, 1])
    reference = single_example_gradients(model, x, y)
    wrapped = BookkeepingModule(model)
    model.zero_grad()
    F.cross_entropy(wrapped(x), y).backward()
    expected_norms = per_example_norms(reference, norm_ord)
    torch.testing.assert_close(wrapped.per_example_norms(norm_ord), expected_norms, rtol=1e-4, atol=1e-5)
    factors = torch.rand(5)
    sums = wrapped.clipped_sums(list(model.parameters()), factors)
    for summed, per_example in zip(sums, reference):
        expected = torch.einsum("i,i...->...", factors, per_example)
        torch.testing.assert_close(summed, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_channels_last_convolutions_get_exact_per_example_gradients(grad_sample_mode):
    """Opacus 1.6's unfold2d misreads channels-last inputs; both gradient sources hand it contiguous ones."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2), nn.Flatten(), nn.Linear(16, 4))
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 7, 7).to(memory_format=torch.channels_last)
    y = torch.tensor([0, 1, 2, 3])
    reference = single_example_gradients(model, x, y)
    if grad_sample_mode == "bookkeeping":
        wrapped = BookkeepingModule(model)
        F.cross_entropy(wrapped(x), y).backward()
        norms = wrapped.per_example_norms(2)
    else:
        wrapped = ExactGradSampleModule(model, loss_reduction="mean")
        F.cross_entropy(wrapped(x), y).backward()
        norms = per_example_norms([p.grad_sample for p in model.parameters()], 2)
    torch.testing.assert_close(norms, per_example_norms(reference, 2), rtol=1e-4, atol=1e-5)


def test_dense_layer_on_sequences_is_materialised_exactly():
    """A dense layer on (batch, time, features) inputs does not factorise: Opacus's sampler is used."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 3), nn.Flatten(), nn.Linear(6, 2))
    x, y = torch.randn(4, 2, 4), torch.tensor([0, 1, 1, 0])
    reference = single_example_gradients(model, x, y)
    wrapped = BookkeepingModule(model)
    F.cross_entropy(wrapped(x), y).backward()
    torch.testing.assert_close(wrapped.per_example_norms(2), per_example_norms(reference, 2))


def test_a_second_backward_pass_before_the_step_is_refused():
    model = mlp(hidden=8)
    wrapped = BookkeepingModule(model)
    x, y = torch.randn(3, 1, 8, 8), torch.tensor([0, 1, 2])
    for _ in range(2):
        F.cross_entropy(wrapped(x), y).backward()
    with pytest.raises(RuntimeError, match="exactly one forward and backward pass"):
        wrapped.per_example_norms(2)
    wrapped.clear()
    F.cross_entropy(wrapped(x), y).backward()
    assert wrapped.per_example_norms(2).shape == (3,)


def test_evaluation_forward_passes_are_not_recorded():
    model = mlp(hidden=8)
    wrapped = BookkeepingModule(model)
    x, y = torch.randn(3, 1, 8, 8), torch.tensor([0, 1, 2])
    with torch.no_grad():
        wrapped(x)
    F.cross_entropy(wrapped(x), y).backward()
    assert wrapped.per_example_norms(1).shape == (3,)


class ScaledLinear(nn.Module):
    """A layer with its own parameter and no Opacus grad sampler."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(64))

    def forward(self, x):
        return x.flatten(1) * self.scale


def test_a_layer_without_a_rule_is_re_run_alone_and_the_model_stays_on_bookkeeping(digits_train):
    model = nn.Sequential(ScaledLinear(), nn.Linear(64, 10))
    assert unsupported_bookkeeping_layers(model) == []
    options = dict(mechanism="lap2", laplace_scale=1.0, max_grad_norm=1.0, delta=1e-5, seed=0)
    module, optimizer, _ = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                        digits_loader(digits_train), **options)
    assert isinstance(module, BookkeepingModule) and optimizer.privacy_engine.grad_sample_mode == "bookkeeping"
    assert optimizer.privacy_engine.gradient_sources == {"0 (ScaledLinear)": "book-keeping, per-layer torch.func",
                                                         "1 (Linear)": "book-keeping rule"}


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_opacus_recurrent_layers_send_the_model_to_the_hooks_with_a_warning():
    from opacus.layers import DPLSTM
    from torch.utils.data import DataLoader, TensorDataset

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = DPLSTM(3, 4, batch_first=True), nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    model = Recurrent()
    assert any(problem.startswith("rnn (DPLSTM)") for problem in unsupported_bookkeeping_layers(model))
    with pytest.raises(ValueError, match="DPLSTM"):
        BookkeepingModule(model)
    data = DataLoader(TensorDataset(torch.randn(16, 5, 3), torch.randint(0, 2, (16,))), batch_size=4)
    with pytest.warns(GradientSourceWarning, match=r"rnn \(DPLSTM\): Opacus's DP recurrent layers"):
        module, optimizer, _ = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                                            mechanism="lap2", laplace_scale=1.0, max_grad_norm=1.0, delta=1e-5, seed=0)
    assert isinstance(module, GradSampleModule) and optimizer.privacy_engine.grad_sample_mode == "hooks"


def test_unknown_grad_sample_mode_is_refused(digits_train):
    model = mlp()
    with pytest.raises(ValueError, match="grad_sample_mode"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(digits_train),
                     mechanism="lap2", laplace_scale=1.0, delta=1e-5, grad_sample_mode="ghost")


@pytest.mark.parametrize("mechanism", ["lap2", "laplace-l1", "gaussian"])
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_training_is_the_same_with_bookkeeping_and_hooks(digits_train, mechanism):
    """Same seed, same batches, same noise: the two gradient sources give the same model."""
    trained = {}
    for mode in ("bookkeeping", "hooks"):
        torch.manual_seed(0)
        model = build_model("cnn", in_channels=1, input_size=8)
        module, optimizer, loader = make_private(
            model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(digits_train, 64),
            mechanism=mechanism, **noise_keywords(mechanism, 0.5), max_grad_norm=0.5, delta=1e-5, seed=4, noise_seed=4, grad_sample_mode=mode,
        )
        batches = iter(loader)
        for _ in range(3):
            inputs, targets = next(batches)
            optimizer.zero_grad()
            F.cross_entropy(module(inputs), targets).backward()
            optimizer.step()
        trained[mode] = [p.detach().clone() for p in model.parameters()]
        assert optimizer.privacy_engine.steps == 3
    for with_bookkeeping, with_hooks in zip(trained["bookkeeping"], trained["hooks"]):
        torch.testing.assert_close(with_bookkeeping, with_hooks, rtol=1e-4, atol=1e-5)
