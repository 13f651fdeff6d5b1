"""The per-example check: every case below is either exact or refused, never passed while wrong.

Each case (a layer mix, a model, a training loop's loss) runs through ``check_per_example`` on both
gradient paths (book-keeping where it supports the model, Opacus's hooks).  An exact case must pass
the check and, independently of it, the engine's gradients of every example of the batch must equal
one-example autograd (``tests/per_example_reference.py``) within 1e-5; a refused case must raise
``PerExampleCheckError`` with a message naming what went wrong.  Models are tiny and random.
"""

from __future__ import annotations

import copy
from functools import partial
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pytest
import torch
from opacus import GradSampleModule
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpnoise import make_private
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.training import (
    BookkeepingModule,
    EngineStateError,
    InvalidTrainingOptionError,
    PerExampleCheckError,
    causal_lm_loss,
    check_per_example,
    verify_per_example_gradients,
)
from dpnoise.training.batches import batch_loss, run_model
from dpnoise.training.bookkeeping import unsupported_bookkeeping_layers
from dpnoise.training.per_example_check import (
    dropout_disabled,
    engine_example_gradients,
    refuse_token_mean_lm_loss,
    wrapped_model,
)
from dpnoise.training.wrapping import wrap_for_per_example_gradients

from per_example_reference import per_example_gradients

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

#: examples per batch; also the sequence length of the cases where a position axis is as long as the batch
BATCH = 6
LENGTH, VOCAB, CLASSES, WIDTH = 5, 23, 3, 8
MODES = ("bookkeeping", "hooks")


# ------------------------------------------------------------------------------------------- data
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def features(width: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    random = generator()
    return torch.randn(BATCH, width, generator=random), torch.randint(0, CLASSES, (BATCH,), generator=random)


def images(channels: int = 3, size: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    random = generator()
    return (torch.randn(BATCH, channels, size, size, generator=random),
            torch.randint(0, CLASSES, (BATCH,), generator=random))


def signals() -> tuple[torch.Tensor, torch.Tensor]:
    random = generator()
    return torch.randn(BATCH, 2, 7, generator=random), torch.randint(0, CLASSES, (BATCH,), generator=random)


def lengths(equal: bool = False) -> torch.Tensor:
    """Real tokens of each sequence: all ``LENGTH``, or between 2 and ``LENGTH``."""
    return torch.full((BATCH,), LENGTH) if equal else torch.tensor([5, 2, 4, 5, 3, 2])


def tokens(length: int = LENGTH) -> torch.Tensor:
    return torch.randint(1, VOCAB, (BATCH, length), generator=generator())


def classified_sentences() -> dict[str, torch.Tensor]:
    """A tokenizer's padded batch with class labels (unequal lengths)."""
    mask = (torch.arange(LENGTH) < lengths()[:, None]).long()
    return {"input_ids": tokens() * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(mask),
            "labels": torch.randint(0, CLASSES, (BATCH,), generator=generator())}


def language_modelling(equal: bool = False) -> dict[str, torch.Tensor]:
    """Padded token ids, their mask and labels (-100 at the padding), as a causal-LM collator gives them."""
    mask = (torch.arange(LENGTH) < lengths(equal)[:, None]).long()
    ids = tokens() * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def token_pairs(equal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token ids, labels)`` for a pair loop over a language model (labels -100 at the padding)."""
    batch = language_modelling(equal)
    return batch["input_ids"], batch["labels"]


def full_token_pairs(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token ids, labels)`` of ``length`` real tokens each."""
    ids = tokens(length)
    return ids, ids


def balanced_token_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """Unequal lengths, but the checked examples (0, 2 and 5) have the batch's mean number of predicted
    tokens (3), so that a token-mean loss gives them their own gradients: only the independence check
    (example 1, 2 predicted tokens, replaced by example 0) can see the mixing."""
    ids = tokens()
    mask = torch.arange(LENGTH) < torch.tensor([4, 3, 4, 4, 5, 4])[:, None]
    return ids, ids.masked_fill(~mask, -100)


# ------------------------------------------------------------------------------------------- losses
def token_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy averaged over all the real tokens of the batch (what Hugging Face does)."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


def summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, reduction="sum")


# ------------------------------------------------------------------------------------------- models
def seeded(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """``build`` run with torch's generator seeded, in training mode."""
    def seeded_build() -> nn.Module:
        torch.manual_seed(0)
        return build().train()
    return seeded_build


class MixingLayer(nn.Module):
    """``mix(linear(x))``: a dense layer followed by an operation over the batch dimension."""

    def __init__(self, mix: Callable[[torch.Tensor], torch.Tensor], width: int = 5):
        super().__init__()
        self.linear = nn.Linear(width, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.mix = mix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(torch.tanh(self.linear(x))))


class AttentionAcrossBatch(nn.Module):
    """Each example attends to every example of the batch."""

    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(5, WIDTH), nn.Linear(5, WIDTH), nn.Linear(5, WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.query(x) @ self.key(x).T / WIDTH**0.5, dim=1)
        return self.head(weights @ self.value(x))


class TinyLanguageModel(nn.Module):
    """nanoGPT's embeddings: token embedding plus position embedding, LayerNorm, a dense head.

    ``positions``: ``"per-sequence"`` is nanoGPT's ``wpe(torch.arange(t))`` (no batch dimension),
    ``"broadcast"`` is ``wpe(torch.arange(t)[None])`` (batch size 1, broadcast over the batch)."""

    def __init__(self, positions: str):
        super().__init__()
        self.positions = positions
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(BATCH, WIDTH)
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1])
        if self.positions == "broadcast":
            positions = positions[None]
        return self.head(self.ln(self.wte(ids) + self.wpe(positions)))


class TiedEmbeddings(nn.Module):
    """An embedding whose weight is also the output layer's (as GPT-2's), on the mean token."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.output = nn.Linear(WIDTH, VOCAB, bias=False)
        self.output.weight = self.embedding.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.output(torch.tanh(self.embedding(ids).mean(1)))


class AppliedTwice(nn.Module):
    """One dense layer used twice in a forward pass."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(5, 5)
        self.head = nn.Linear(5, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.shared(torch.tanh(self.shared(x))))


class Scale(nn.Module):
    """``x * weight``: a layer of its own, for a deliberately wrong per-example rule."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width) + 0.1 * torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def summed_over_batch_sampler(layer: Scale, activations: list[torch.Tensor], backprops: torch.Tensor) -> dict:
    """A wrong Opacus grad sampler: every example is given the whole batch's gradient."""
    summed = (activations[0] * backprops).sum(0)
    return {layer.weight: summed.expand(len(backprops), *summed.shape)}


def token_lm() -> nn.Module:
    """A per-token language model (embedding, dense head): its examples are separate, whatever the loss."""
    return nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Tanh(), nn.Linear(WIDTH, VOCAB))


def mlp(dropout: float = 0.0) -> nn.Module:
    return nn.Sequential(nn.Linear(5, WIDTH), nn.Tanh(), nn.Dropout(dropout), nn.Linear(WIDTH, CLASSES))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2),
                         nn.Flatten(), nn.Linear(16, CLASSES))


def bert(attention: str = "sdpa") -> nn.Module:
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=CLASSES,
                                     hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2,
                                     attn_implementation=attention)
    return transformers.BertForSequenceClassification(config)


def distilbert() -> nn.Module:
    config = transformers.DistilBertConfig(vocab_size=VOCAB, dim=16, n_layers=1, n_heads=2, hidden_dim=32,
                                           max_position_embeddings=16, num_labels=CLASSES, dropout=0.2)
    return transformers.DistilBertForSequenceClassification(config)


def roberta() -> nn.Module:
    config = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, max_position_embeddings=16, num_labels=CLASSES,
                                        pad_token_id=0)
    return transformers.RobertaForSequenceClassification(config)


def gpt2(attention: str = "sdpa") -> nn.Module:
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=16,
                                     bos_token_id=1, eos_token_id=1, resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2,
                                     attn_implementation=attention)
    return transformers.GPT2LMHeadModel(config)


def llama() -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
                                      bos_token_id=1, eos_token_id=1, pad_token_id=0)
    return transformers.LlamaForCausalLM(config)


def vit() -> nn.Module:
    config = transformers.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                    image_size=8, patch_size=4, num_channels=3, num_labels=CLASSES,
                                    hidden_dropout_prob=0.2)
    return transformers.ViTForImageClassification(config)


def t5() -> nn.Module:
    config = transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                   relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
                                   eos_token_id=1, dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(config)


def translation(source_length: int) -> dict[str, torch.Tensor]:
    """Full-length source and target sequences (no padding: the token mean is the per-sequence mean)."""
    random = generator()
    return {"input_ids": torch.randint(2, VOCAB, (BATCH, source_length), generator=random),
            "labels": torch.randint(2, VOCAB, (BATCH, source_length), generator=random)}


# ------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    """A model, a batch and a loss; ``refusal``: a pattern of the check's error (None: the case is exact)."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[], Any]
    loss_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None
    refusal: Optional[str] = None
    #: the gradient sources that refuse the case (the others compute it exactly)
    refused_by: tuple[str, ...] = MODES
    #: whether book-keeping supports every trainable layer (else make_private uses the hooks)
    bookkeeping: bool = True
    #: Opacus grad samplers registered for the case (layer type -> sampler)
    grad_samplers: dict = field(default_factory=dict)


EXACTNESS = r"exactness vs\. one-example autograd"
CASES = [
    Case("mlp", seeded(mlp), features),
    Case("mlp-with-dropout", seeded(lambda: mlp(dropout=0.5)), features),
    Case("cnn-conv2d-groupnorm", seeded(cnn), images),
    Case("conv1d", seeded(lambda: nn.Sequential(nn.Conv1d(2, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(15, CLASSES))),
         signals),
    Case("embedding-linear", seeded(lambda: nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Flatten(),
                                                         nn.Linear(LENGTH * WIDTH, CLASSES))),
         lambda: (tokens(), features()[1])),
    Case("layernorm", seeded(lambda: nn.Sequential(nn.Linear(5, WIDTH), nn.LayerNorm(WIDTH),
                                                  nn.Linear(WIDTH, CLASSES))), features),
    Case("tied-weights", seeded(TiedEmbeddings), lambda: (tokens(), tokens(1)[:, 0])),
    Case("layer-applied-twice", seeded(AppliedTwice), features),
    Case("positions-broadcast-over-batch", seeded(lambda: TinyLanguageModel("broadcast")), token_pairs,
         causal_lm_loss),
    Case("pair-loop-per-sequence-loss", seeded(token_lm), token_pairs, causal_lm_loss),
    Case("bert-eager-dropout", seeded(lambda: bert("eager")), classified_sentences),
    Case("bert-sdpa-dropout", seeded(lambda: bert("sdpa")), classified_sentences),
    Case("distilbert", seeded(distilbert), classified_sentences),
    Case("roberta", seeded(roberta), classified_sentences),
    Case("gpt2-eager-causal-lm-loss", seeded(lambda: gpt2("eager")), language_modelling, causal_lm_loss),
    Case("gpt2-sdpa-causal-lm-loss", seeded(lambda: gpt2("sdpa")), language_modelling, causal_lm_loss),
    Case("gpt2-own-loss-equal-lengths", seeded(gpt2), lambda: language_modelling(equal=True)),
    Case("llama-causal-lm-loss", seeded(llama), language_modelling, causal_lm_loss),
    # refused
    Case("nanogpt-positions-length-equals-batch", seeded(lambda: TinyLanguageModel("per-sequence")),
         lambda: full_token_pairs(BATCH), causal_lm_loss, refusal=r"wpe\.weight \(Embedding\)"),
    Case("nanogpt-positions-length-not-batch", seeded(lambda: TinyLanguageModel("per-sequence")),
         lambda: full_token_pairs(LENGTH), causal_lm_loss,
         refusal=r"engine refuses this model: wpe \(Embedding\): its input has leading dimension 5"),
    Case("mean-centred-over-batch", seeded(lambda: MixingLayer(lambda h: h - h.mean(0))), features, refusal=EXACTNESS),
    Case("softmax-over-batch", seeded(lambda: MixingLayer(lambda h: h * torch.softmax(h, dim=0))), features,
         refusal=EXACTNESS),
    Case("cumsum-over-batch", seeded(lambda: MixingLayer(lambda h: h.cumsum(0))), features, refusal=EXACTNESS),
    Case("batch-mean-normalisation", seeded(lambda: MixingLayer(lambda h: h / h.pow(2).mean().sqrt())), features,
         refusal=EXACTNESS),
    Case("batchnorm1d-train-mode", seeded(lambda: MixingLayer(nn.BatchNorm1d(WIDTH, affine=False))), features,
         refusal=r"runs on the batch but not on one example alone"),
    Case("attention-across-batch", seeded(AttentionAcrossBatch), features, refusal=EXACTNESS),
    Case("pair-loop-token-mean-loss", seeded(token_lm), token_pairs, token_mean_loss, refusal=EXACTNESS),
    Case("pair-loop-token-mean-balanced-lengths", seeded(token_lm), balanced_token_pairs, token_mean_loss,
         refusal=r"independence when example 1 was replaced"),
    Case("summed-loss", seeded(mlp), features, summed_cross_entropy, refusal=r"loss is summed over the batch"),
    Case("gpt2-own-loss-unequal-lengths", seeded(gpt2), language_modelling, refusal=EXACTNESS),
    Case("llama-own-loss-unequal-lengths", seeded(llama), language_modelling, refusal=EXACTNESS),
    Case("t5-source-length-equals-batch", seeded(t5), lambda: translation(BATCH),
         refusal=r"relative_attention_bias\.weight \(Embedding\)", bookkeeping=False),
    Case("t5-source-length-not-batch", seeded(t5), lambda: translation(LENGTH),
         refusal=r"engine refuses this model: .*relative_attention_bias \(Embedding\): its input has leading "
                 r"dimension 5",
         bookkeeping=False),
    Case("conv2d-reflect-padding", seeded(lambda: nn.Sequential(nn.Conv2d(3, 2, 3, padding=1, padding_mode="reflect"),
                                                                nn.Flatten(), nn.Linear(72, CLASSES))), images),
    Case("conv1d-circular-padding", seeded(lambda: nn.Sequential(nn.Conv1d(2, 3, 3, padding=2, padding_mode="circular"),
                                                                 nn.Flatten(), nn.Linear(27, CLASSES))), signals),
    Case("conv2d-instancenorm", seeded(lambda: nn.Sequential(nn.Conv2d(3, 2, 3), nn.InstanceNorm2d(2, affine=True),
                                                             nn.Flatten(), nn.Linear(32, CLASSES))), images),
    Case("embedding-padding-idx-rmsnorm", seeded(lambda: nn.Sequential(
        nn.Embedding(VOCAB, WIDTH, padding_idx=0), nn.RMSNorm(WIDTH), nn.Flatten(), nn.Linear(LENGTH * WIDTH, CLASSES))),
        lambda: (tokens() * (torch.arange(LENGTH) < lengths()[:, None]), features()[1])),
    Case("embeddingbag-mean-repeated-ids", seeded(lambda: nn.Sequential(nn.EmbeddingBag(VOCAB, WIDTH, mode="mean"),
                                                                        nn.Linear(WIDTH, CLASSES))),
         lambda: (torch.cat([tokens(2), tokens(2)], dim=1), features()[1])),
    Case("label-smoothing-loss", seeded(mlp), features, partial(F.cross_entropy, label_smoothing=0.1)),
    # book-keeping reads ViTEmbeddings' CLS token and position embeddings off the gradient at its dropout (captured)
    Case("vit", seeded(vit), lambda: {"pixel_values": images(size=8)[0], "labels": images()[1]},
         refusal=r"engine refuses this model: vit\.embeddings \(ViTEmbeddings\) is called with keyword arguments",
         refused_by=("hooks",)),
    Case("wrong-per-example-rule", seeded(lambda: nn.Sequential(nn.Linear(5, WIDTH), Scale(WIDTH),
                                                                 nn.Linear(WIDTH, CLASSES))),
         features, refusal=r"1\.weight \(Scale\)", refused_by=("hooks",),
         grad_samplers={Scale: summed_over_batch_sampler}),
]


def one_example(batch: Any, index: int) -> Any:
    """Example ``index`` of a pair or dict batch, as a batch of one."""
    if isinstance(batch, dict):
        return {key: value[index : index + 1] for key, value in batch.items()}
    return tuple(value[index : index + 1] for value in batch)


def in_float64(batch: Any) -> Any:
    cast = (lambda value: value.double() if value.is_floating_point() else value)
    return {key: cast(value) for key, value in batch.items()} if isinstance(batch, dict) else tuple(map(cast, batch))


def assert_engine_equals_one_example_autograd(model: nn.Module, case: Case, mode: str) -> None:
    """The gradients the check reads from the engine, for every example of the batch, equal autograd on that
    example alone (in float64, dropout off), independently of the check's own comparison."""
    model = copy.deepcopy(model).double()
    private, _ = wrap_for_per_example_gradients(copy.deepcopy(model), mode)
    batch = in_float64(case.batch())
    engine_params = tuple(p for p in wrapped_model(private).parameters() if p.requires_grad)
    params = [p for p in model.parameters() if p.requires_grad]

    def example_loss(i: int) -> torch.Tensor:
        example = one_example(batch, i)
        return batch_loss(run_model(model, example), example, case.loss_fn)

    with dropout_disabled():
        engine = engine_example_gradients(private, batch, case.loss_fn, engine_params, list(range(BATCH)))
        reference = per_example_gradients(params, example_loss, BATCH)
    for found, expected in zip(engine, reference, strict=True):
        difference = (found - expected).flatten(1).norm(dim=1)
        assert torch.all(difference <= 1e-5 * expected.flatten(1).norm(dim=1) + 1e-10), difference


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_each_case_is_exact_or_refused(case, mode, monkeypatch):
    for layer_type, sampler in case.grad_samplers.items():
        monkeypatch.setitem(GradSampleModule.GRAD_SAMPLERS, layer_type, sampler)
    model = case.build()
    unsupported = unsupported_bookkeeping_layers(model)
    assert not unsupported == case.bookkeeping, unsupported
    if mode == "bookkeeping" and unsupported:
        pytest.skip(f"book-keeping does not support {unsupported[0]} (make_private uses the hooks)")
    if case.refusal is not None and mode in case.refused_by:
        with pytest.raises(PerExampleCheckError, match=case.refusal):
            check_per_example(model, case.loss_fn, case.batch(), grad_sample_mode=mode)
        return
    report = check_per_example(model, case.loss_fn, case.batch(), grad_sample_mode=mode)
    assert report.engine == mode and report.skipped is None and len(report.examples) == 3
    assert report.exactness.error <= 1e-5 and report.independence.error <= 1e-5
    assert_engine_equals_one_example_autograd(model, case, mode)


# ------------------------------------------------------------------------------------------- the check's contract
def test_check_per_example_leaves_the_users_model_untouched():
    model = seeded(lambda: nn.Sequential(nn.Linear(5, WIDTH), nn.BatchNorm1d(WIDTH, affine=False),
                                         nn.Linear(WIDTH, CLASSES)))()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(PerExampleCheckError):  # batch statistics
        check_per_example(model, None, features())
    check_per_example(model[2], None, features(WIDTH))
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]) and value.dtype == state[key].dtype, key
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight)) and model[2].weight.grad is None
    assert all(not layer._forward_hooks and not layer._forward_pre_hooks and "forward" not in layer.__dict__
               for layer in model.modules())
    assert all(getattr(p, "grad_sample", None) is None for p in model.parameters())


def test_dropout_still_drops_outside_the_check():
    model = seeded(lambda: mlp(dropout=0.5))()
    x = features()[0]
    check_per_example(model, None, features())
    assert not torch.equal(model(x), model(x))
    with dropout_disabled():
        assert torch.equal(model(x), model(x))
    assert not torch.equal(model(x), model(x))
    assert F.dropout.__module__ == "torch.nn.functional"


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("build", [bert, gpt2], ids=["bert", "gpt2"])
def test_dropout_is_off_in_hugging_face_attention_within_the_check(build, attention):
    """Attention dropout (eager: nn.functional.dropout; SDPA: dropout_p) and hidden dropout are all off."""
    torch.manual_seed(0)
    model = build(attention).train()
    batch = classified_sentences() if build is bert else language_modelling()
    batch.pop("labels")
    with dropout_disabled():
        assert torch.equal(model(**batch).logits, model(**batch).logits)
    assert not torch.equal(model(**batch).logits, model(**batch).logits)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("mode", MODES)
def test_the_check_runs_on_make_privates_module_between_steps(mode):
    """Before the first step and after a step, the check leaves the private module as it found it (the
    released gradient in ``grad``; the next step sees only its own batch's pass); with a pass recorded
    and not consumed, it refuses to run."""
    torch.manual_seed(0)
    model = mlp()
    data = TensorDataset(torch.randn(64, 5), torch.randint(0, CLASSES, (64,)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # noise_seed's reproducibility warning
        private, optimizer, loader = make_private(model, optimizer, DataLoader(data, batch_size=32),
                                                  mechanism="gaussian", noise_multiplier=1.0, delta=1e-5,
                                                  noise_seed=0, grad_sample_mode=mode)
    report = verify_per_example_gradients(private, features())
    assert report.engine == mode and report.examples == (0, 2, 5) and report.seconds > 0
    assert all(p.grad is None and p.dtype == torch.float32 for p in model.parameters())
    batches = iter(loader)
    x, y = next(batches)
    F.cross_entropy(private(x), y).backward()
    with pytest.raises(EngineStateError, match="between optimizer steps"):
        verify_per_example_gradients(private, features())
    optimizer.step()
    released = [p.grad.clone() for p in model.parameters()]
    verify_per_example_gradients(private, features())
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), released))
    optimizer.zero_grad()
    x, y = next(batches)
    F.cross_entropy(private(x), y).backward()
    optimizer.step()  # neither the check's passes nor its records are taken for this batch's
    assert optimizer.privacy_engine.steps == 2


def test_a_batch_of_one_example_is_not_checked():
    report = check_per_example(mlp(), None, tuple(t[:1] for t in features()))
    assert report.skipped.startswith("a batch of 1 example(s)") and report.examples == ()


def test_paused_bookkeeping_gives_plain_autograd_gradients_and_records_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, WIDTH), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES))
    plain = copy.deepcopy(model)
    keeper = BookkeepingModule(model)
    x, y = features()
    with keeper.paused():
        F.cross_entropy(keeper(x), y).backward()
    F.cross_entropy(plain(x), y).backward()
    assert not keeper.has_records
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    model.zero_grad()
    F.cross_entropy(keeper(x), y).backward()  # recording again, and nothing untracked from the paused pass
    assert keeper.has_records and keeper.per_example_norms(2).shape == (BATCH,)


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_hugging_face_causal_lms_need_a_per_sequence_loss(build):
    model = build()
    with pytest.raises(PerExampleCheckError, match=r"mean over the batch's tokens.*loss_fn=dpnoise\.training\."
                                                   r"causal_lm_loss"):
        refuse_token_mean_lm_loss(model, None)
    refuse_token_mean_lm_loss(model, causal_lm_loss)
    refuse_token_mean_lm_loss(bert(), None)
    refuse_token_mean_lm_loss(mlp(), None)


def test_the_checks_options_are_validated():
    with pytest.raises(InvalidTrainingOptionError, match="grad_sample_mode must be one of"):
        check_per_example(mlp(), None, features(), grad_sample_mode="bookeeping")
    with pytest.raises(InvalidParameterError, match="examples must be >= 1"):
        check_per_example(mlp(), None, features(), examples=0)
    with pytest.raises(InvalidTrainingOptionError, match="needs the private module make_private returns"):
        verify_per_example_gradients(mlp(), features())
