"""Book-keeping's per-layer torch.func source: any trainable layer without a rule, alone, per example."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.t5.modeling_t5 import T5LayerNorm

from dpnoise.mechanisms import per_example_norms
from dpnoise.training.bookkeeping import BookkeepingModule, gradient_sources, unsupported_bookkeeping_layers
from dpnoise.training.errors import UnsupportedLayerError

from per_example_reference import single_example_gradients

WIDTH, LENGTH, CLASSES = 6, 4, 3


class LayerScale(nn.Module):
    """A learned per-feature scale (CaiT / ConvNeXt's layer scale) and gate."""

    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(0.5 + torch.rand(WIDTH))
        self.gate = nn.Parameter(torch.randn(()))

    def forward(self, x):
        return x * self.gamma * torch.sigmoid(self.gate)


class ClassTokenEmbedding(nn.Module):
    """ViT-style: a linear patch embedding (a sub-layer with a rule), a CLS token and position embeddings of its
    own, with a keyword that holds no tensor."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(5, WIDTH)
        self.cls_token = nn.Parameter(torch.randn(1, 1, WIDTH))
        self.positions = nn.Parameter(torch.randn(1, LENGTH + 1, WIDTH))

    def forward(self, x, scale=1.0):
        return scale * (torch.cat([self.cls_token.expand(len(x), -1, -1), self.patch(x)], dim=1) + self.positions)


class Head(nn.Module):
    """Sequence (batch, LENGTH', WIDTH) -> classes, through ``body``."""

    def __init__(self, *body, length=LENGTH):
        super().__init__()
        self.body = nn.Sequential(*body)
        self.out = nn.Linear(length * WIDTH, CLASSES)

    def forward(self, x):
        return self.out(torch.tanh(self.body(x)).flatten(1))


class KeywordCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = ClassTokenEmbedding()

    def forward(self, x):
        return self.embed(x, scale=2.0)


BOOKKEEPING_SOURCES = {"book-keeping rule", "book-keeping, materialised", "book-keeping, per-layer torch.func"}


def sequences(batch=5):
    return torch.randn(batch, LENGTH, WIDTH) * 2, torch.randint(0, CLASSES, (batch,))


MODELS = {
    "llama-rmsnorm": (lambda: Head(nn.Linear(WIDTH, WIDTH), LlamaRMSNorm(WIDTH)), sequences),
    "t5-layernorm": (lambda: Head(nn.Linear(WIDTH, WIDTH), T5LayerNorm(WIDTH)), sequences),
    "gemma-rmsnorm (1 + weight)": (lambda: Head(GemmaRMSNorm(WIDTH), nn.Linear(WIDTH, WIDTH)), sequences),
    "layer-scale-and-gate": (lambda: Head(nn.Linear(WIDTH, WIDTH), LayerScale()), sequences),
    "cls-token-and-positions": (lambda: Head(ClassTokenEmbedding(), length=LENGTH + 1),
                                lambda: (torch.randn(5, LENGTH, 5), torch.randint(0, CLASSES, (5,)))),
    "constant-keyword": (lambda: Head(KeywordCall(), length=LENGTH + 1),
                         lambda: (torch.randn(5, LENGTH, 5), torch.randint(0, CLASSES, (5,)))),
}


@pytest.mark.parametrize("norm_ord", [1, 2])
@pytest.mark.parametrize("name", MODELS)
def test_norms_and_clipped_sums_equal_one_example_autograd(name, norm_ord):
    build, batch = MODELS[name]
    torch.manual_seed(0)
    model, (x, y) = build(), batch()
    if name.startswith("gemma"):
        nn.init.normal_(model.body[0].weight)  # not the initial zeros, which hide a missing "1 +"
    assert unsupported_bookkeeping_layers(model) == []
    assert set(gradient_sources(model, "bookkeeping").values()) <= BOOKKEEPING_SOURCES
    reference = single_example_gradients(model, x, y)
    wrapped = BookkeepingModule(model)
    model.zero_grad()
    F.cross_entropy(wrapped(x), y).backward()
    torch.testing.assert_close(wrapped.per_example_norms(norm_ord), per_example_norms(reference, norm_ord),
                               rtol=1e-5, atol=1e-6)
    factors = torch.rand(len(x))
    for summed, per_example in zip(wrapped.clipped_sums(list(model.parameters()), factors), reference):
        torch.testing.assert_close(summed, torch.einsum("i,i...->...", factors, per_example), rtol=1e-5, atol=1e-6)


def test_a_rerun_layer_with_dropout_is_refused_at_the_step():
    model = Head(nn.Linear(WIDTH, WIDTH), DropoutScale())
    wrapped = BookkeepingModule(model)
    x, y = sequences()
    F.cross_entropy(wrapped(x), y).backward()
    with pytest.raises(UnsupportedLayerError, match="DropoutScale draws random numbers"):
        wrapped.per_example_norms(2)


class DropoutScale(LayerScale):
    def forward(self, x):
        return F.dropout(super().forward(x), p=0.5, training=self.training)


class PairOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH))

    def forward(self, x):
        return x * self.weight, x


def test_a_rerun_layer_must_return_one_tensor():
    model = nn.Sequential(PairOutput())
    wrapped = BookkeepingModule(model)
    with pytest.raises(UnsupportedLayerError, match=r"0 \(PairOutput\) returns tuple"):
        wrapped(torch.randn(3, WIDTH))


def test_a_tensor_keyword_is_refused():
    class TensorKeyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = ClassTokenEmbedding()

        def forward(self, x):
            return self.embed(x, scale=torch.ones(len(x), 1, 1))

    wrapped = BookkeepingModule(TensorKeyword())
    with pytest.raises(UnsupportedLayerError, match=r"keyword arguments \(scale\)"):
        wrapped(torch.randn(3, LENGTH, 5))


def test_hugging_face_rms_norms_take_the_rule_where_their_forward_is_the_formula():
    """Llama's and T5's RMSNorm by the rule; Gemma's (1 + weight), which has no rule, and a class under Llama's
    registered name whose forward computes another formula, by the per-layer source."""
    sources = {name: gradient_sources(MODELS[name][0](), "bookkeeping")["body.1 (LlamaRMSNorm)" if name.startswith(
        "llama") else "body.1 (T5LayerNorm)"] for name in ("llama-rmsnorm", "t5-layernorm")}
    assert set(sources.values()) == {"book-keeping rule"}
    gemma = gradient_sources(MODELS["gemma-rmsnorm (1 + weight)"][0](), "bookkeeping")["body.0 (GemmaRMSNorm)"]
    assert gemma == "book-keeping, per-layer torch.func"

    class ShiftedRMSNorm(LlamaRMSNorm):
        def forward(self, hidden_states):
            return super().forward(hidden_states) + 1.0

    norm = ShiftedRMSNorm(WIDTH)
    ShiftedRMSNorm.__module__, ShiftedRMSNorm.__qualname__ = LlamaRMSNorm.__module__, LlamaRMSNorm.__qualname__
    assert gradient_sources(nn.Sequential(norm), "bookkeeping")["0 (ShiftedRMSNorm)"] == \
        "book-keeping, per-layer torch.func"

