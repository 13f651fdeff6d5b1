"""Every layer's per-example gradients are exact in both gradient sources, or the layer is refused before
training with a message naming its path (issue 39, items 3 and 4).

Each exactness case runs in float64 and compares, with one-example-at-a-time autograd (relative 1e-5),
the per-example L1 and L2 norms (laplace-l1 clips in L1; gaussian and lap2 in L2) and the clipped sums of
all trainable parameters, and under Opacus's hooks the per-example gradients themselves.
"""

import warnings
from functools import partial

import pytest
import torch
from opacus.layers import DPGRU, DPLSTM, DPRNN
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise.layers import ClsToken, LayerInputError, PositionEmbedding, Scale, Shift
from dpnoise.mechanisms import clip_factors, get_mechanism, per_example_norms
from dpnoise.training import endless_batches, make_private
from dpnoise.training.bookkeeping import BookkeepingModule, check_layer_inputs, gradient_sources
from dpnoise.training.errors import GradientSourceWarning, UnsupportedLayerError
from dpnoise.training.grad_samplers import ExactGradSampleModule
from dpnoise.training.summary import gradient_sources_line

from per_example_reference import layer_case, per_example_gradients

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

BATCH = 4
SOURCES = ("bookkeeping", "hooks")
#: the clipping norms of the gradient mechanisms: L2 (gaussian, lap2) and L1 (laplace-l1)
NORM_ORDERS = sorted({get_mechanism(name).clip_norm_ord for name in ("gaussian", "lap2", "laplace-l1")})


class Hooks:
    """The hooks' source as the engine sets it up: the layer-input checks, then ``ExactGradSampleModule``."""

    def __init__(self, model: nn.Module):
        self.inputs = check_layer_inputs(model)
        self.module = ExactGradSampleModule(model, loss_reduction="mean")

    def remove(self) -> None:
        self.module._close()
        self.inputs.remove()


def assert_exact(source, model, example_losses, batch=BATCH):
    """``example_losses(module, examples)``: the per-example losses of ``examples`` (a slice) under ``module``;
    ``source``'s norms and clipped sums (and, for hooks, per-example gradients) equal the reference's."""
    params = [p for p in model.parameters() if p.requires_grad]
    reference = per_example_gradients(params, lambda i: example_losses(model, slice(i, i + 1)).sum(), batch)
    for norm_ord in NORM_ORDERS:
        model.zero_grad()
        expected_norms = per_example_norms(reference, norm_ord)
        factors = clip_factors(expected_norms, float(expected_norms.median()))
        expected_sums = [torch.einsum("i,i...->...", factors, g) for g in reference]
        if source == "bookkeeping":
            wrapped = BookkeepingModule(model)
            example_losses(wrapped, slice(None)).mean().backward()
            norms = wrapped.per_example_norms(norm_ord)
            sums = wrapped.clipped_sums(params, factors)
            wrapped.remove_hooks()
        else:
            hooks = Hooks(model)
            example_losses(hooks.module, slice(None)).mean().backward()
            samples = [p.grad_sample for p in params]
            for sample, expected in zip(samples, reference):
                torch.testing.assert_close(sample, expected, rtol=1e-5, atol=1e-9)
            norms = per_example_norms(samples, norm_ord)
            sums = [torch.einsum("i,i...->...", factors, sample) for sample in samples]
            hooks.remove()
            for p in params:
                p.grad_sample = None
        torch.testing.assert_close(norms, expected_norms, rtol=1e-5, atol=1e-9)
        for summed, expected in zip(sums, expected_sums):
            torch.testing.assert_close(summed, expected, rtol=1e-5, atol=1e-9)


# ---------------------------------------------------------------------------------------- convolutions
CONVOLUTIONS = {
    "conv1d": (nn.Conv1d, (9,)),
    "conv2d": (nn.Conv2d, (6, 7)),
    "conv3d": (nn.Conv3d, (4, 5, 4)),
}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("padding", [1, 2, "same", "valid"])
@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "circular", "replicate"])
@pytest.mark.parametrize("conv", sorted(CONVOLUTIONS))
def test_convolutions_in_every_padding_mode(conv, padding_mode, padding, source):
    """Opacus's samplers took every padding to be zeros (norms 2-3 % off, clipped sums 11-23 %)."""
    torch.manual_seed(0)
    layer_type, size = CONVOLUTIONS[conv]
    layer = layer_type(4, 6, 3, padding=padding, padding_mode=padding_mode, groups=2, bias=True)
    assert_exact(source, *layer_case(layer, torch.randn(BATCH, 4, *size, dtype=torch.float64)))


@pytest.mark.parametrize("source", SOURCES)
def test_a_strided_dilated_reflect_padded_conv2d_in_a_model(source):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 4, (3, 2), stride=(2, 1), dilation=(1, 2), padding=(2, 1),
                                    padding_mode="reflect"), nn.Tanh(), nn.Conv2d(4, 2, 3, padding=1,
                                                                                   padding_mode="circular"),
                          nn.Flatten(), nn.Linear(2 * 5 * 7, 3))
    assert_exact(source, *layer_case(model, torch.randn(BATCH, 3, 8, 7, dtype=torch.float64)))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("layer, shape", [
    (nn.RMSNorm(5), (3, 5)), (nn.RMSNorm((3, 5), eps=1e-3), (3, 5)), (nn.GroupNorm(2, 4), (4, 6)),
    (nn.InstanceNorm1d(4, affine=True), (4, 6)), (nn.InstanceNorm2d(3, affine=True), (3, 4, 5)),
], ids=["rms", "rms-2d", "group", "instance1d", "instance2d"])
def test_normalisations_recorded_by_bookkeeping(layer, shape, source):
    torch.manual_seed(2)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    assert_exact(source, *layer_case(layer, torch.randn(BATCH, *shape, dtype=torch.float64) * 2 + 1))


# ------------------------------------------------------------------ transposed convolutions and PReLU
TRANSPOSED_GEOMETRIES = {  # keyword arguments of a transposed convolution in 1-D and 2-D
    "plain": ({}, {}),
    "strided-padded": ({"stride": 2, "padding": 1, "output_padding": 1},
                       {"stride": 2, "padding": 1, "output_padding": 1}),
    "dilated": ({"stride": 3, "padding": 2, "output_padding": 2, "dilation": 2},
                {"stride": (2, 3), "padding": (2, 1), "output_padding": (1, 2), "dilation": (1, 2)}),
    "output-padding-below-dilation": ({"padding": 1, "output_padding": 1, "dilation": 2},
                                      {"padding": (0, 2), "output_padding": (1, 0), "dilation": (2, 1)}),
}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("geometry", sorted(TRANSPOSED_GEOMETRIES))
@pytest.mark.parametrize("dims", [1, 2])
def test_transposed_convolutions(dims, geometry, groups, bias, source):
    """Every stride, padding, output padding, dilation and groups (zeros is a transposed convolution's only
    padding mode)."""
    torch.manual_seed(9)
    layer_type, size = (nn.ConvTranspose1d, (7,)) if dims == 1 else (nn.ConvTranspose2d, (5, 4))
    layer = layer_type(4, 6, 3, groups=groups, bias=bias, **TRANSPOSED_GEOMETRIES[geometry][dims - 1])
    assert_exact(source, *layer_case(layer, torch.randn(BATCH, 4, *size, dtype=torch.float64)))
    assert set(gradient_sources(layer, "bookkeeping").values()) == {"book-keeping, materialised"}
    assert set(gradient_sources(layer, "hooks").values()) == {"hooks, grad sampler"}


class SizedUpsampling(nn.Module):
    """A transposed convolution told its output size (which sets its output padding) by keyword."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 2, 3, stride=(2, 3), padding=1)

    def forward(self, x):
        return self.up(x, output_size=[2 * x.shape[2], 3 * x.shape[3]])


@pytest.mark.parametrize("source", SOURCES)
def test_a_transposed_convolution_given_its_output_size(source):
    torch.manual_seed(10)
    model = SizedUpsampling()
    model, losses = layer_case(model, torch.randn(BATCH, 3, 3, 4, dtype=torch.float64))
    assert model(torch.randn(1, 3, 3, 4, dtype=torch.float64)).shape == (1, 2, 6, 12)  # output padding (1, 2)
    assert_exact(source, model, losses)


@pytest.mark.parametrize("source", SOURCES)
def test_a_transposed_convolution_with_a_frozen_weight_and_a_trained_bias(source):
    torch.manual_seed(10)
    layer = nn.ConvTranspose2d(3, 2, 2, stride=2)
    layer.weight.requires_grad_(False)
    nn.init.normal_(layer.bias)
    assert_exact(source, *layer_case(layer, torch.randn(BATCH, 3, 3, 4, dtype=torch.float64)))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("shape", [(3,), (3, 5), (3, 4, 2)])
def test_prelu_with_one_slope_or_one_per_channel(shape, channels, source):
    torch.manual_seed(11)
    layer = nn.PReLU(channels)
    nn.init.normal_(layer.weight)
    x = torch.randn(BATCH, *shape, dtype=torch.float64)
    x[0, 0] = 0  # PyTorch's kernel takes x = 0 on the slope's side
    assert_exact(source, *layer_case(layer, x))
    assert gradient_sources(layer, "bookkeeping") == {"<model> (PReLU)": "book-keeping, materialised"}


@pytest.mark.parametrize("source", SOURCES)
def test_a_decoder_of_transposed_convolutions_and_prelus(source):
    torch.manual_seed(12)
    model = nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1), nn.PReLU(4),
                          nn.ConvTranspose1d(4 * 6, 2, 2, stride=2, groups=2), nn.PReLU(), nn.Flatten(),
                          nn.Linear(2 * 16, 3))
    model.insert(2, nn.Flatten(1, 2))  # (B, 4, 6, 8) -> (B, 24, 8): the 1-D layer's channels
    assert_exact(source, *layer_case(model, torch.randn(BATCH, 3, 3, 4, dtype=torch.float64)))


# ------------------------------------------------------------------------ elementwise layers of dpnoise
def randomised(layer):
    """``layer`` with every parameter drawn from a normal law (not an initial value that hides a mistake)."""
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    return layer


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("layer, shape", [
    (Scale(5), (5,)), (Scale(5), (3, 5)), (Scale(5), (2, 3, 5)), (Scale((3, 1, 1)), (3, 4, 2)), (Scale(()), (3, 5)),
    (Scale((3, 5)), (2, 1, 5)),  # the scale broadcasts the input too
    (Shift(5), (3, 5)), (Shift((3, 5)), (2, 3, 5)), (Shift((3, 1, 1)), (3, 4, 2)), (Shift(()), (4,)),
    (ClsToken(5), (3, 5)), (ClsToken(5), (1, 5)),
    (PositionEmbedding(6, 5), (6, 5)), (PositionEmbedding(6, 5), (3, 5)), (PositionEmbedding(6, 5), (2, 4, 5)),
], ids=["scale", "scale-sequence", "scale-extra-dims", "scale-channels", "gate", "scale-broadcasting-the-input",
        "shift-sequence", "shift-extra-dims", "shift-channels", "shift-scalar", "cls-token", "cls-token-one-token",
        "positions-full", "positions-shorter", "positions-extra-dims"])
def test_elementwise_layers(layer, shape, source):
    torch.manual_seed(13)
    assert_exact(source, *layer_case(randomised(layer), torch.randn(BATCH, *shape, dtype=torch.float64)))
    assert set(gradient_sources(layer, "bookkeeping").values()) == {"book-keeping rule"}


class TinyVit(nn.Module):
    """ViT's embeddings and a block with layer scales, from dpnoise's elementwise layers."""

    def __init__(self, patches=4, patch=6, width=5, classes=3):
        super().__init__()
        self.patch = nn.Linear(patch, width)
        self.cls = ClsToken(width)
        self.positions = PositionEmbedding(patches + 1, width)
        self.mlp = nn.Linear(width, width)
        self.layer_scale = Scale(width)
        self.shift = Shift(width)
        self.gate = Scale(())
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        tokens = self.positions(self.cls(self.patch(x)))
        tokens = tokens + self.layer_scale(torch.tanh(self.mlp(tokens)))
        return self.head(self.gate(self.shift(tokens))[:, 0])


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("frozen", [None, "layer_scale", "head"])
def test_a_vit_from_elementwise_layers(frozen, source):
    torch.manual_seed(14)
    model = randomised(TinyVit())
    if frozen is not None:
        getattr(model, frozen).requires_grad_(False)
    assert_exact(source, *layer_case(model, torch.randn(BATCH, 4, 6, dtype=torch.float64)))
    sources = gradient_sources(model, "bookkeeping")
    assert set(sources.values()) == {"book-keeping rule"} and len(sources) == 8 - (frozen is not None)


def test_make_private_takes_the_new_sources_and_its_first_step_check_passes():
    """``auto`` keeps book-keeping, no layer is re-run per example, and the first step's comparison with
    one-example autograd (before any noise) accepts them."""
    torch.manual_seed(15)
    model = nn.Sequential(nn.ConvTranspose1d(4, 3, 3, stride=2), nn.PReLU(3), nn.Flatten(1, 1), TinyVit(3, 13))
    data = TensorDataset(torch.randn(40, 4, 6), torch.randint(0, 3, (40,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GradientSourceWarning)
        module, optimizer, loader = private(model, data)
    assert set(optimizer.privacy_engine.gradient_sources.values()) == {"book-keeping rule",
                                                                       "book-keeping, materialised"}
    x, y = next((x, y) for x, y in endless_batches(loader) if len(x) >= 2)
    F.cross_entropy(module(x), y).backward()
    optimizer.step()
    assert optimizer.privacy_engine.steps == 1


@pytest.mark.parametrize("layer, shape", [(Scale((4, 5)), (5,)), (Shift(5), ()), (ClsToken(5), (3, 4)),
                                          (PositionEmbedding(2, 5), (3, 5))],
                         ids=["weight-over-the-batch", "scalar", "cls-width", "positions-too-long"])
def test_elementwise_layers_refuse_inputs_they_would_not_compute_per_example(layer, shape):
    with pytest.raises(LayerInputError, match=type(layer).__name__):
        layer(torch.randn(BATCH, *shape))


# ------------------------------------------------------------------------------------------ embeddings
class TokensWithRmsNorm(nn.Module):
    """Token embeddings with a padding id, an RMSNorm and a head (the model whose RMSNorm used to switch
    "auto" to hooks, where the padding row got per-example gradients)."""

    def __init__(self, vocab=7, width=4, classes=3):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width, padding_idx=0)
        self.norm = nn.RMSNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, ids):
        return self.head(self.norm(self.tokens(ids)).mean(1))


def token_ids(examples=BATCH, length=6, vocab=7):
    ids = torch.randint(1, vocab, (examples, length))
    ids[:, -2:] = 0  # padding after every sentence
    return ids


@pytest.mark.parametrize("source", SOURCES)
def test_the_padding_row_of_an_embedding_gets_no_per_example_gradient(source):
    torch.manual_seed(2)
    model = TokensWithRmsNorm().double()
    with torch.no_grad():
        model.norm.weight.normal_()
    assert_exact(source, *layer_case(model, token_ids()))


def test_an_rms_norm_keeps_auto_on_bookkeeping():
    torch.manual_seed(3)
    model = TokensWithRmsNorm()
    data = TensorDataset(token_ids(40), torch.randint(0, 3, (40,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GradientSourceWarning)
        module, optimizer, _ = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                            DataLoader(data, batch_size=8), mechanism="lap2", laplace_scale=1.0,
                                            delta=1e-5)
    engine = optimizer.privacy_engine
    assert isinstance(module, BookkeepingModule) and engine.grad_sample_mode == "bookkeeping"
    assert engine.gradient_sources == {"tokens (Embedding)": "book-keeping rule",
                                       "norm (RMSNorm)": "book-keeping, materialised",
                                       "head (Linear)": "book-keeping rule"}


class Bags(nn.Module):
    """An ``nn.EmbeddingBag`` called on 1-D ids with offsets, one bag per example, as the example slices
    of one tensor ``(ids, offsets, per-sample weights)`` hold them."""

    def __init__(self, bag: nn.EmbeddingBag, ids, offsets, weights=None):
        super().__init__()
        self.bag, self.ids, self.offsets, self.weights = bag, ids, offsets, weights
        self.ends = torch.cat([offsets[1:], torch.tensor([len(ids)])])

    def losses(self, output_weights):
        def losses(module, examples):
            starts, ends = self.offsets[examples], self.ends[examples]
            ids = torch.cat([self.ids[s:e] for s, e in zip(starts, ends)])
            offsets = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), ends - starts]), 0)
            args = (ids, offsets if self.bag.include_last_offset else offsets[:-1])
            if self.weights is not None:
                args += (torch.cat([self.weights[s:e] for s, e in zip(starts, ends)]),)
            return (output_weights[examples] * torch.tanh(module(*args))).sum(1)
        return losses


BAG_IDS = torch.tensor([1, 1, 2, 3, 3, 3, 0, 1, 4, 4, 5])  # repeated ids in every bag, padding id 0
BAG_OFFSETS = torch.tensor([0, 3, 6, 6])  # the third bag is empty


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("include_last_offset", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bags_on_ids_with_offsets(mode, padding_idx, include_last_offset, source):
    """Opacus's sampler counted an id repeated in a bag once (mode "mean": 10 % off)."""
    torch.manual_seed(4)
    bag = nn.EmbeddingBag(6, 3, mode=mode, padding_idx=padding_idx, include_last_offset=include_last_offset).double()
    model = Bags(bag, BAG_IDS, BAG_OFFSETS)
    assert_exact(source, bag, model.losses(torch.randn(BATCH, 3, dtype=torch.float64)))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bags_with_per_sample_weights(include_last_offset, source):
    torch.manual_seed(5)
    bag = nn.EmbeddingBag(6, 3, mode="sum", include_last_offset=include_last_offset).double()
    model = Bags(bag, BAG_IDS, BAG_OFFSETS, torch.randn(len(BAG_IDS), dtype=torch.float64))
    assert_exact(source, bag, model.losses(torch.randn(BATCH, 3, dtype=torch.float64)))


class BagClassifier(nn.Module):
    """An ``nn.EmbeddingBag`` on 2-D ids (one bag per row), optionally per-sample weights, and a head."""

    def __init__(self, mode, padding_idx=None, weighted=False):
        super().__init__()
        self.bag = nn.EmbeddingBag(6, 3, mode=mode, padding_idx=padding_idx)
        self.head = nn.Linear(3, 2)
        self.weighted = weighted

    def forward(self, ids):
        if self.weighted:
            return self.head(self.bag(ids, None, torch.linspace(0.5, 2.0, ids.shape[1], dtype=torch.float64)
                                      .expand(ids.shape)))
        return self.head(self.bag(ids))


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("mode, padding_idx, weighted", [("sum", None, False), ("mean", None, False),
                                                         ("max", None, False), ("mean", 0, False),
                                                         ("max", 0, False), ("sum", 0, True)])
def test_embedding_bags_on_2d_ids(mode, padding_idx, weighted, source):
    """2-D input used to crash Opacus's sampler."""
    torch.manual_seed(6)
    ids = torch.tensor([[1, 1, 2], [3, 3, 3], [0, 1, 0], [4, 4, 5]])
    assert_exact(source, *layer_case(BagClassifier(mode, padding_idx, weighted), ids))


# ------------------------------------------------------------------------------------------- refusals
def private(model, data, **options):
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=8),
                        **{"mechanism": "gaussian", "noise_multiplier": 1.0, "delta": 1e-5, **options})


class Recurrent(nn.Module):
    def __init__(self, layer_type):
        super().__init__()
        self.rnn = layer_type(3, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


@pytest.mark.parametrize("grad_sample_mode", ["auto", "bookkeeping", "hooks"])
@pytest.mark.parametrize("layer_type", [nn.RNN, nn.LSTM, nn.GRU])
def test_recurrent_layers_are_refused_before_training(layer_type, grad_sample_mode):
    """nn.RNN used to crash in the backward pass (``output with shape [1, 8] doesn't match ...``); the
    refusal names dpnoise's drop-in replacement and fix_model."""
    model = Recurrent(layer_type)
    data = TensorDataset(torch.randn(16, 5, 3), torch.randint(0, 2, (16,)))
    name = layer_type.__name__
    with pytest.raises(UnsupportedLayerError, match=rf"rnn \({name}\): .*dpnoise\.layers\.{name}.*fix_model"):
        private(model, data, grad_sample_mode=grad_sample_mode)


@pytest.mark.parametrize("layer_type", [DPRNN, DPLSTM, DPGRU])
def test_opacus_recurrent_replacements_are_exact_under_hooks(layer_type):
    torch.manual_seed(8)
    model = Recurrent(layer_type)
    assert_exact("hooks", *layer_case(model, torch.randn(BATCH, 5, 3, dtype=torch.float64)))
    assert set(gradient_sources(model, "hooks").values()) == {"hooks, grad sampler"}


class NanoGpt(nn.Module):
    """nanoGPT's embeddings: ``wpe(torch.arange(t))``, positions without a batch dimension (or expanded)."""

    def __init__(self, expand_positions=False, vocab=11, width=4, length=16):
        super().__init__()
        self.transformer = nn.ModuleDict({"wte": nn.Embedding(vocab, width), "wpe": nn.Embedding(length, width)})
        self.head = nn.Linear(width, 2)
        self.expand_positions = expand_positions

    def forward(self, idx):
        b, t = idx.shape
        pos = torch.arange(t)
        if self.expand_positions:
            pos = pos.expand(b, t)
        return self.head(torch.tanh(self.transformer.wte(idx) + self.transformer.wpe(pos)).mean(1))


class RelativePositionBias(nn.Module):
    """T5's ``relative_attention_bias``: an embedding of the ``(q_len, k_len)`` relative positions."""

    def __init__(self, width=4):
        super().__init__()
        self.tokens = nn.Embedding(11, width)
        self.relative_attention_bias = nn.Embedding(32, 1)

    def forward(self, idx):
        t = idx.shape[1]
        relative = torch.arange(t)[None, :] - torch.arange(t)[:, None] + t
        bias = self.relative_attention_bias(relative)[..., 0]  # (t, t)
        hidden = self.tokens(idx)
        return (torch.softmax(hidden @ hidden.transpose(1, 2) + bias, -1) @ hidden).mean(1)[:, :2]


class ScalarIdBias(nn.Module):
    """One learnt bias row, looked up by a scalar id."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(11, 2)
        self.bias = nn.Embedding(1, 2)

    def forward(self, idx):
        return self.tokens(idx).mean(1) + self.bias(torch.tensor(0))


def wrap(source, model):
    return BookkeepingModule(model) if source == "bookkeeping" else Hooks(model).module


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("model, path, found", [
    (NanoGpt(), r"transformer\.wpe \(Embedding\)", "leading dimension 6"),
    (RelativePositionBias(), r"relative_attention_bias \(Embedding\)", "leading dimension 6"),
    (ScalarIdBias(), r"bias \(Embedding\)", "a scalar"),
])
def test_an_input_without_a_batch_dimension_is_refused_naming_the_layer(model, path, found, source):
    """``wpe(torch.arange(t))`` with t != B: book-keeping used to refuse at the step naming layer types only,
    the hooks to crash (``stack expects each tensor to be equal size``)."""
    wrapped = wrap(source, model)
    with pytest.raises(UnsupportedLayerError, match=rf"^{path}: its input has {found} in a call of the model on "
                                                    rf"4 examples.*expand it over the batch"):
        wrapped(torch.randint(0, 11, (BATCH, 6)))


@pytest.mark.parametrize("grad_sample_mode", ["auto", "hooks"])
def test_make_private_refuses_positions_without_a_batch_dimension_at_the_first_forward_pass(grad_sample_mode):
    model = NanoGpt()
    module, optimizer, loader = private(model, TensorDataset(torch.randint(0, 11, (40, 6)), torch.randint(0, 2, (40,))),
                                        grad_sample_mode=grad_sample_mode)
    x, y = next((x, y) for x, y in endless_batches(loader) if len(x) not in (0, 6))  # t = B: shapes cannot tell
    with pytest.raises(UnsupportedLayerError, match=r"transformer\.wpe \(Embedding\): its input has leading dimension 6"):
        F.cross_entropy(module(x), y).backward()
    assert optimizer.privacy_engine.steps == 0


@pytest.mark.parametrize("source", SOURCES)
def test_positions_expanded_over_the_batch_are_exact(source):
    torch.manual_seed(7)
    assert_exact(source, *layer_case(NanoGpt(expand_positions=True), torch.randint(0, 11, (BATCH, 6))))


class Scaled(nn.Module):
    """A layer with its own parameter and no grad sampler (functorch under hooks), called with a keyword."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x, shift=None):
        return x * self.scale + (0 if shift is None else shift * self.scale ** 2)


class ScaledTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaled = Scaled()

    def forward(self, x):
        return self.scaled(x, shift=2 * x)


def test_a_layer_called_with_arguments_its_gradients_would_not_read_is_refused():
    """functorch differentiates a layer on its first input alone: the keyword made its per-example
    gradients silently wrong (norms 5-8 times too small)."""
    wrapped = wrap("hooks", ScaledTwice())
    with pytest.raises(UnsupportedLayerError, match=r"^scaled \(Scaled\) is called with keyword arguments \(shift\)"):
        wrapped(torch.randn(BATCH, 3))


# ----------------------------------------------------------------------------------- gradient sources
class ConvAndScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3, padding=1, padding_mode="reflect")
        self.scaled = Scaled()
        self.head = nn.Linear(3 * 5, 2)

    def forward(self, x):
        return self.head(self.scaled(self.conv(x)).flatten(1))


def test_auto_keeps_a_model_with_a_layer_of_its_own_on_bookkeeping_and_reports_every_source():
    model = ConvAndScale()
    data = TensorDataset(torch.randn(40, 2, 5), torch.randint(0, 2, (40,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GradientSourceWarning)
        module, optimizer, _ = private(model, data)
    assert isinstance(module, BookkeepingModule)
    assert optimizer.privacy_engine.gradient_sources == {"conv (Conv1d)": "book-keeping, materialised",
                                                         "scaled (Scaled)": "book-keeping, per-layer torch.func",
                                                         "head (Linear)": "book-keeping rule"}
    assert gradient_sources(model, "hooks")["scaled (Scaled)"] == "hooks, functorch"
    assert gradient_sources_line(optimizer.privacy_engine.gradient_sources) == (
        "per-example gradients by layer: book-keeping, materialised: conv (Conv1d); "
        "book-keeping, per-layer torch.func: scaled (Scaled); book-keeping rule: head (Linear)")


# ------------------------------------------------------------------- Hugging Face's ViT embeddings
IMAGE, PATCH = 16, 4


def tiny_vit(dropout: float = 0.0, model_class: str = "ViTForImageClassification", **options) -> nn.Module:
    """A ViT of one layer, as transformers initialises it, on 16 px images in patches of 4 (16 patches and a CLS
    token of width 8); its default attention (SDPA) stays in float64, where the eager one takes the softmax in
    float32, whose rounding the key bias's gradient (zero in exact arithmetic) would carry."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.ViTConfig(image_size=IMAGE, patch_size=PATCH, hidden_size=8, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=16, num_labels=3,
                                    hidden_dropout_prob=dropout, attention_probs_dropout_prob=0.0)
    return getattr(transformers, model_class)(config, **options)


class OnImages(nn.Module):
    """``model(images, **keywords)`` as one tensor: a classifier's logits, an encoder's last hidden state."""

    def __init__(self, model: nn.Module, **keywords):
        super().__init__()
        self.model, self.keywords = model, keywords

    def forward(self, images):
        outputs = self.model(images, **self.keywords)
        return outputs.logits if "logits" in outputs else outputs.last_hidden_state


def images(size=IMAGE, batch=BATCH):
    return torch.randn(batch, 3, size, size, dtype=torch.float64)


def value_keyed_dropout(inputs, p=0.5, training=True, inplace=False):
    """Dropout whose mask is a function of each entry's value: a batch and each of its examples alone draw the
    same masks (different ones for different examples), so one-example autograd stays the reference."""
    if not training or p == 0:
        return inputs
    keep = torch.frac(inputs.detach().abs() * 1e4) >= p
    return inputs * keep / (1 - p)


def test_vit_embeddings_take_the_captured_source():
    sources = gradient_sources(tiny_vit(), "bookkeeping")
    assert sources["vit.embeddings (ViTEmbeddings)"] == "book-keeping, captured gradient"
    assert sources["vit.embeddings.patch_embeddings.projection (Conv2d)"] == "book-keeping, materialised"
    assert set(sources.values()) == {"book-keeping, captured gradient", "book-keeping, materialised",
                                     "book-keeping rule"}


@pytest.mark.parametrize("frozen", [None, "cls_token"])
@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_vit_embeddings_are_exact(dropout, frozen, monkeypatch):
    """The CLS token's and position embeddings' per-example gradients, read off the gradient at the dropout's
    input (its mask included), and the patch convolution's, equal one-example autograd's."""
    monkeypatch.setattr(F, "dropout", value_keyed_dropout)
    torch.manual_seed(16)
    model = randomised(tiny_vit(dropout))
    if frozen is not None:
        getattr(model.vit.embeddings, frozen).requires_grad_(False)
    assert_exact("bookkeeping", *layer_case(OnImages(model), images()))


def test_the_captured_gradient_holds_the_dropout_mask():
    """With torch's own dropout, the examples' gradients of the CLS token and position embeddings add up to the
    batch gradient autograd gives them in the same pass (which runs through the same masks)."""
    torch.manual_seed(17)
    model = randomised(tiny_vit(dropout=0.5)).double()
    wrapped = BookkeepingModule(model)
    F.cross_entropy(wrapped(images()).logits, torch.arange(BATCH) % 3).backward()
    embeddings = model.vit.embeddings
    params = [embeddings.cls_token, embeddings.position_embeddings]
    for summed, p in zip(wrapped.clipped_sums(params, torch.full((BATCH,), 1 / BATCH, dtype=torch.float64)), params):
        torch.testing.assert_close(summed, p.grad, rtol=1e-10, atol=1e-12)
    wrapped.remove_hooks()


def test_a_vit_with_a_mask_token_is_exact_and_refuses_masked_patches():
    """Without ``bool_masked_pos`` the mask token is unused (a zero gradient); masked patches are refused at the
    call, naming the layer."""
    torch.manual_seed(18)
    model = randomised(tiny_vit(model_class="ViTModel", add_pooling_layer=False, use_mask_token=True))
    assert_exact("bookkeeping", *layer_case(OnImages(model), images()))
    masked = OnImages(model, bool_masked_pos=torch.rand(BATCH, (IMAGE // PATCH) ** 2) < 0.5)
    wrapped = BookkeepingModule(masked)
    with pytest.raises(UnsupportedLayerError,
                       match=r"^model\.embeddings \(ViTEmbeddings\) is called with keyword arguments \(bool_masked_pos"):
        wrapped(images())


def test_interpolated_position_embeddings_are_re_run_per_example():
    """``interpolate_pos_encoding=True`` on larger images: that call's per-example gradients come from re-running
    the embeddings per example (exact), and with dropout that re-run is refused at the step, naming the layer."""
    torch.manual_seed(19)
    assert_exact("bookkeeping", *layer_case(OnImages(randomised(tiny_vit()), interpolate_pos_encoding=True),
                                            images(20)))
    wrapped = BookkeepingModule(OnImages(tiny_vit(dropout=0.3).double(), interpolate_pos_encoding=True))
    wrapped(images(20)).sum().backward()
    with pytest.raises(UnsupportedLayerError, match=r"^ViTEmbeddings draws random numbers"):
        wrapped.per_example_norms(2)


@pytest.mark.parametrize("change", ["dropout", "forward"])
def test_vit_embeddings_of_another_structure_are_re_run_per_example(change):
    """The source applies only where the layer is the one its formula reads: otherwise the per-layer torch.func
    source (exact) takes it."""
    torch.manual_seed(20)
    model = randomised(tiny_vit())
    embeddings = model.vit.embeddings
    if change == "dropout":
        embeddings.dropout = nn.Identity()
    else:
        embeddings.forward = partial(type(embeddings).forward, embeddings)
    assert gradient_sources(model, "bookkeeping")["vit.embeddings (ViTEmbeddings)"] == \
        "book-keeping, per-layer torch.func"
    if change == "dropout":
        assert_exact("bookkeeping", *layer_case(OnImages(model), images()))


def dropout_twice(self, pixel_values, bool_masked_pos=None, interpolate_pos_encoding=False):
    embeddings = torch.cat([self.cls_token.expand(len(pixel_values), -1, -1), self.patch_embeddings(pixel_values)], 1)
    return self.dropout(self.dropout(embeddings + self.position_embeddings))


def without_dropout(self, pixel_values, bool_masked_pos=None, interpolate_pos_encoding=False):
    embeddings = torch.cat([self.cls_token.expand(len(pixel_values), -1, -1), self.patch_embeddings(pixel_values)], 1)
    return embeddings + self.position_embeddings


@pytest.mark.parametrize("forward, found", [(dropout_twice, "its Dropout ran twice in one call"),
                                            (without_dropout, "its forward did not run the module")])
def test_a_vit_embeddings_forward_of_another_version_is_refused_at_the_call(forward, found, monkeypatch):
    """A forward that does not run the capture point exactly once (another version of the class, say) is refused,
    never read off a gradient its formula does not give."""
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    monkeypatch.setattr(ViTEmbeddings, "forward", forward)
    wrapped = BookkeepingModule(tiny_vit())
    with pytest.raises(UnsupportedLayerError, match=rf"^vit\.embeddings \(ViTEmbeddings\): {found}"):
        wrapped(images().float())


def test_make_private_trains_a_vit_with_dropout_on_the_captured_source():
    """``auto`` keeps book-keeping with no layer re-run per example, the first step's per-example check passes,
    and later steps train through dropout (which the per-layer torch.func source refused)."""
    torch.manual_seed(21)
    model = tiny_vit(dropout=0.1)
    data = TensorDataset(torch.randn(40, 3, IMAGE, IMAGE), torch.randint(0, 3, (40,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GradientSourceWarning)
        module, optimizer, loader = private(model, data)
    engine = optimizer.privacy_engine
    assert engine.gradient_sources["vit.embeddings (ViTEmbeddings)"] == "book-keeping, captured gradient"
    assert "book-keeping, per-layer torch.func" not in engine.gradient_sources.values()
    batches = (batch for batch in endless_batches(loader) if len(batch[0]) >= 2)
    for _ in range(3):
        x, y = next(batches)
        optimizer.zero_grad()
        F.cross_entropy(module(x).logits, y).backward()
        optimizer.step()
    assert engine.steps == 3 and engine.per_example_report.examples
