"""Book-keeping of sequence layers and Hugging Face models equals one-example-at-a-time autograd.

Every case runs in float64 and compares the L1 and L2 per-example norms and the clipped sums of all
trainable parameters (relative 1e-5) with gradients computed by one backward pass per example.
"""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from dpnoise.mechanisms import per_example_norms
from dpnoise.training.bookkeeping import BookkeepingModule, unsupported_bookkeeping_layers
from dpnoise.training.errors import EngineStateError
from dpnoise.training.per_example_gradients import (
    DenseRows,
    IndexedRows,
    ParameterGradients,
    ghost_is_cheaper,
    ghost_squared_norms,
)

from per_example_reference import layer_case, per_example_gradients

transformers = pytest.importorskip("transformers")

BATCH = 5


def assert_matches_single_examples(model, example_losses, batch=BATCH, **options):
    """``example_losses(module, examples)``: the per-example losses of ``examples`` (a slice) under ``module``."""
    params = [p for p in model.parameters() if p.requires_grad]
    reference = per_example_gradients(params, lambda i: example_losses(model, slice(i, i + 1)).sum(), batch)
    wrapped = BookkeepingModule(model, **options)
    example_losses(wrapped, slice(None)).mean().backward()
    for norm_ord in (1, 2):
        torch.testing.assert_close(wrapped.per_example_norms(norm_ord), per_example_norms(reference, norm_ord),
                                   rtol=1e-5, atol=1e-9)
    factors = torch.rand(batch, dtype=torch.float64)
    for p, summed, per_example in zip(params, wrapped.clipped_sums(params, factors), reference):
        assert summed.shape == p.shape
        torch.testing.assert_close(summed, torch.einsum("i,i...->...", factors, per_example), rtol=1e-5, atol=1e-9)
    wrapped.remove_hooks()
    return reference


@pytest.mark.parametrize("extra", [(), (1,), (4,), (2, 3)], ids=["2d", "T=1", "T=4", "extra-dims"])
@pytest.mark.parametrize("width", [(5, 3), (16, 16)], ids=["materialised", "ghost"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_on_sequences(extra, width, bias):
    torch.manual_seed(0)
    d_in, d_out = width
    assert ghost_is_cheaper(DenseRows(torch.zeros(1, 4, d_out), torch.zeros(1, 4, d_in))) == (d_in == 16)
    assert_matches_single_examples(*layer_case(nn.Linear(d_in, d_out, bias=bias), torch.randn(BATCH, *extra, d_in,
                                                                                               dtype=torch.float64)))


def test_linear_with_a_frozen_weight_and_a_trainable_bias():
    torch.manual_seed(1)
    layer = nn.Linear(4, 3)
    layer.weight.requires_grad_(False)
    reference = assert_matches_single_examples(*layer_case(layer, torch.randn(BATCH, 6, 4, dtype=torch.float64)))
    assert len(reference) == 1 and reference[0].shape == (BATCH, 3)


@pytest.mark.parametrize("extra", [(1,), (4,), (2, 3)])
def test_transformers_conv1d_whose_weight_is_transposed(extra):
    torch.manual_seed(2)
    layer = transformers.pytorch_utils.Conv1D(3, 5)
    nn.init.normal_(layer.bias)
    assert_matches_single_examples(*layer_case(layer, torch.randn(BATCH, *extra, 5, dtype=torch.float64)))


@pytest.mark.parametrize("shape", [(BATCH,), (BATCH, 1), (BATCH, 7), (BATCH, 2, 3)])
@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_sums_repeated_tokens(shape, padding_idx):
    torch.manual_seed(3)
    ids = torch.randint(0, 4, shape)  # few distinct ids: repeats within and across examples, padding included
    assert_matches_single_examples(*layer_case(nn.Embedding(6, 3, padding_idx=padding_idx), ids))


@pytest.mark.parametrize("normalized, shape", [(4, (3, 4)), ((3, 4), (2, 3, 4)), (4, (4,))])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_on_sequences(normalized, shape, bias):
    torch.manual_seed(4)
    layer = nn.LayerNorm(normalized, bias=bias)
    with torch.no_grad():
        layer.weight.normal_()
    assert_matches_single_examples(*layer_case(layer, torch.randn(BATCH, *shape, dtype=torch.float64) * 2 + 1))


def test_group_norm_on_sequences():
    torch.manual_seed(5)
    assert_matches_single_examples(*layer_case(nn.GroupNorm(2, 4), torch.randn(BATCH, 4, 6, dtype=torch.float64)))


def test_l1_norms_materialised_in_chunks_of_examples():
    torch.manual_seed(6)
    layer, losses = layer_case(nn.Linear(5, 3), torch.randn(BATCH, 4, 5, dtype=torch.float64))
    assert_matches_single_examples(layer, losses, max_chunk_elements=20)  # one example (15 entries) per chunk


class TokenModel(nn.Module):
    """Token and broadcast position embeddings, a layer norm and a dense layer used twice; an unused branch."""

    def __init__(self, vocab=7, width=4, tied_head=False):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width, padding_idx=0)
        self.positions = nn.Embedding(16, width)
        self.norm = nn.LayerNorm(width)
        self.dense = nn.Linear(width, width)
        self.unused = nn.Linear(width, 2)
        self.head = nn.Linear(width, vocab, bias=False)
        if tied_head:
            self.head.weight = self.tokens.weight

    def forward(self, ids):
        positions = torch.arange(ids.shape[1]).unsqueeze(0)  # (1, T): broadcast over the batch
        hidden = self.norm(self.tokens(ids) + self.positions(positions))
        hidden = self.dense(torch.tanh(self.dense(hidden)))
        self.unused(hidden)  # the loss does not reach it: zero gradient
        return self.head(hidden)


def token_losses(ids, targets):
    def losses(module, examples):
        logits = module(ids[examples])
        return F.cross_entropy(logits.transpose(1, 2), targets[examples], reduction="none").mean(1)
    return losses


@pytest.mark.parametrize("tied_head", [False, True], ids=["separate-head", "tied-head"])
def test_broadcast_positions_repeated_layers_tied_weights_and_unreached_layers(tied_head):
    torch.manual_seed(7)
    model = TokenModel(tied_head=tied_head).double()
    ids, targets = torch.randint(0, 7, (BATCH, 6)), torch.randint(0, 7, (BATCH, 6))
    reference = assert_matches_single_examples(model, token_losses(ids, targets))
    params = [p for p in model.parameters() if p.requires_grad]
    unused = [i for i, p in enumerate(params) if p is model.unused.weight or p is model.unused.bias]
    assert len(unused) == 2 and all(not reference[i].any() for i in unused)
    assert all(reference[i].abs().sum() > 0 for i in range(len(params)) if i not in unused)


def test_tied_weights_materialised_when_the_ghost_norm_is_dearer():
    """T = 12 rows on a 7 x 4 weight: the dense rows are materialised with the one-hot rows added."""
    torch.manual_seed(8)
    model = TokenModel(tied_head=True).double()
    ids, targets = torch.randint(0, 7, (BATCH, 12)), torch.randint(0, 7, (BATCH, 12))
    assert not ghost_is_cheaper(DenseRows(torch.zeros(1, 12, 7), torch.zeros(1, 12, 4)))
    assert_matches_single_examples(model, token_losses(ids, targets))


def test_ghost_norms_of_dense_and_indexed_rows_equal_materialised_norms():
    torch.manual_seed(9)
    dense = DenseRows(torch.randn(3, 5, 6, dtype=torch.float64), torch.randn(3, 5, 40, dtype=torch.float64))
    indexed = IndexedRows(torch.randint(0, 6, (3, 4)), torch.randn(3, 4, 40, dtype=torch.float64), rows=6)
    materialised = torch.einsum("brp,brq->bpq", dense.left, dense.right)
    for i in range(3):
        materialised[i].index_add_(0, indexed.index[i], indexed.right[i])
    assert ghost_is_cheaper(dense)
    gradients = ParameterGradients(torch.Size((6, 40)), [dense, indexed])
    torch.testing.assert_close(gradients.norm_power(2), materialised.square().sum((1, 2)))
    torch.testing.assert_close(gradients.norm_power(1), materialised.abs().sum((1, 2)))
    torch.testing.assert_close(ghost_squared_norms(dense, max_chunk_elements=1),
                               torch.einsum("brp,brq->bpq", dense.left, dense.right).square().sum((1, 2)))


def test_an_empty_poisson_batch_gives_no_norms_and_zero_sums():
    model = TokenModel().double()
    wrapped = BookkeepingModule(model)
    ids = torch.zeros(0, 5, dtype=torch.long)
    F.cross_entropy(wrapped(ids).transpose(1, 2), ids, reduction="sum").backward()
    assert wrapped.per_example_norms(2).shape == (0,)
    params = list(model.parameters())
    assert all(not s.any() and s.shape == p.shape for p, s in zip(params, wrapped.clipped_sums(params, torch.zeros(0))))


def tiny_bert(**overrides):
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                                     vocab_size=100, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, **overrides)
    torch.manual_seed(10)
    return config


def padded_batch(length=9):
    torch.manual_seed(11)
    ids = torch.randint(1, 100, (BATCH, length))
    lengths = torch.tensor([length, 1, 4, length - 2, 6])
    mask = (torch.arange(length) < lengths.unsqueeze(1)).long()
    return ids * mask, mask  # padding id 0 after each sentence's end


def bert_losses(ids, mask, labels):
    def losses(module, examples):
        logits = module(input_ids=ids[examples], attention_mask=mask[examples]).logits
        return F.cross_entropy(logits, labels[examples], reduction="none")
    return losses


def test_tiny_bert_for_sequence_classification_with_every_parameter_trainable():
    model = transformers.BertForSequenceClassification(tiny_bert(num_labels=2)).double().train()
    ids, mask = padded_batch()
    assert_matches_single_examples(model, bert_losses(ids, mask, torch.tensor([0, 1, 1, 0, 1])))


class FirstTokenClassifier(nn.Module):
    """A head on the first token's hidden state: BertModel's pooler runs but the loss does not reach it."""

    def __init__(self, config):
        super().__init__()
        self.bert = transformers.BertModel(config)
        self.head = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids, attention_mask):
        return self.head(self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0])


def test_a_layer_the_loss_does_not_reach_gets_a_zero_gradient():
    model = FirstTokenClassifier(tiny_bert()).double().train()
    ids, mask = padded_batch()
    labels = torch.tensor([0, 1, 1, 0, 1])
    reference = assert_matches_single_examples(
        model, lambda m, s: F.cross_entropy(m(ids[s], mask[s]), labels[s], reduction="none"))
    pooler = {id(p) for p in model.bert.pooler.parameters()}
    params = [p for p in model.parameters() if p.requires_grad]
    assert all(not g.any() for p, g in zip(params, reference) if id(p) in pooler)


def test_tiny_gpt2_with_its_tied_embedding_and_output_layer():
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(12)
    model = transformers.GPT2LMHeadModel(config).double().train()
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(0, 100, (BATCH, 8))

    def losses(module, examples):
        logits = module(input_ids=ids[examples]).logits[:, :-1]
        return F.cross_entropy(logits.transpose(1, 2), ids[examples, 1:], reduction="none").mean(1)

    assert_matches_single_examples(model, losses)


def test_bf16_autocast_computes_norms_and_sums_in_float32():
    model = transformers.BertForSequenceClassification(tiny_bert(num_labels=2)).train()
    ids, mask = padded_batch()
    labels = torch.tensor([0, 1, 1, 0, 1])
    params = list(model.parameters())
    reference = per_example_gradients(params, lambda i: bert_losses(ids, mask, labels)(model, slice(i, i + 1)).sum(),
                                      BATCH)
    wrapped = BookkeepingModule(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = bert_losses(ids, mask, labels)(wrapped, slice(None)).mean()
    loss.backward()
    norms = wrapped.per_example_norms(2)
    assert norms.dtype == torch.float32
    torch.testing.assert_close(norms, per_example_norms(reference, 2), rtol=0.05, atol=0)
    sums = wrapped.clipped_sums(params, torch.ones(BATCH))
    assert all(s.dtype == torch.float32 for s in sums)


def test_a_parameter_used_outside_its_layer_is_refused_at_the_step():
    layer = nn.Linear(3, 2)
    wrapped = BookkeepingModule(layer)
    x = torch.randn(4, 3)
    (wrapped(x).sum() + layer.weight.square().sum()).backward()  # the weight's second use bypasses the layer
    with pytest.raises(EngineStateError, match="weight received gradients outside book-keeping"):
        wrapped.per_example_norms(2)


def test_an_evaluation_mode_backward_pass_is_refused_at_the_step():
    layer = nn.Linear(3, 2)
    wrapped = BookkeepingModule(layer).eval()
    wrapped(torch.randn(4, 3)).sum().backward()
    with pytest.raises(EngineStateError, match=r"model\.train\(\)"):
        wrapped.per_example_norms(2)


@pytest.mark.parametrize("passes", ["two forward passes", "two backward passes"])
def test_accumulation_is_refused(passes):
    layer = nn.Linear(3, 2)
    wrapped = BookkeepingModule(layer)
    if passes == "two forward passes":
        (wrapped(torch.randn(4, 3)).sum() + wrapped(torch.randn(4, 3)).sum()).backward()
    else:
        loss = wrapped(torch.randn(4, 3)).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    with pytest.raises(EngineStateError, match="exactly one forward and backward pass"):
        wrapped.per_example_norms(2)


def test_layers_without_exact_rules_are_named():
    shared = nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(2, 4))
    shared[1].weight = shared[0].bias  # a bias (rule) shared with a GroupNorm weight (grad sampler)
    problems = unsupported_bookkeeping_layers(shared)
    assert len(problems) == 1 and "parameter 0.bias is shared by 0 (Linear), 1 (GroupNorm)" in problems[0]
    assert unsupported_bookkeeping_layers(nn.Embedding(5, 2, max_norm=1.0)) == [
        "<model> (Embedding): max_norm renormalises the weight in place during the forward pass"]


class TokenIdClassifier(nn.Module):
    """A Hugging Face classifier called on padded token ids alone (padding id 0)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, attention_mask=(ids != 0).long()).logits


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_make_private_trains_bert_alike_with_bookkeeping_and_hooks():
    """Both gradient sources give every example its own position embeddings (the (1, T) buffer)."""
    from torch.utils.data import DataLoader, TensorDataset

    from dpnoise.training import make_private

    torch.manual_seed(13)
    ids = torch.randint(1, 100, (40, 9)) * (torch.arange(9) < torch.randint(1, 10, (40, 1)))
    data = TensorDataset(ids, torch.randint(0, 2, (40,)))
    initial = transformers.BertForSequenceClassification(tiny_bert(num_labels=2))
    before = [p.detach().clone() for p in initial.parameters()]
    trained = {}
    for mode in ("auto", "hooks"):
        model = transformers.BertForSequenceClassification(tiny_bert(num_labels=2)).train()
        model.load_state_dict(initial.state_dict())
        module, optimizer, loader = make_private(
            TokenIdClassifier(model), torch.optim.SGD(model.parameters(), lr=0.5), DataLoader(data, batch_size=8),
            mechanism="gaussian", noise_multiplier=0.5, max_grad_norm=0.1, delta=1e-5, seed=4, noise_seed=4, grad_sample_mode=mode)
        assert optimizer.privacy_engine.grad_sample_mode == ("bookkeeping" if mode == "auto" else "hooks")
        for _, (x, y) in zip(range(2), loader):
            optimizer.zero_grad()
            F.cross_entropy(module(x), y).backward()
            optimizer.step()
        trained[mode] = [p.detach().clone() for p in model.parameters()]
    for with_bookkeeping, with_hooks in zip(trained["auto"], trained["hooks"]):
        torch.testing.assert_close(with_bookkeeping, with_hooks, rtol=1e-4, atol=1e-5)
    assert all(not torch.equal(p, q) for p, q in zip(trained["auto"], before))


def test_a_graph_kept_past_the_step_holds_no_recorded_tensors():
    """``loss`` alive until the next forward (the usual loop) must not keep the step's inputs and gradients."""
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2), nn.LayerNorm(2))
    wrapped = BookkeepingModule(model)
    loss = wrapped(torch.randn(4, 3)).square().sum()
    loss.backward()
    wrapped.clipped_sums(list(model.parameters()), torch.ones(4))
    nodes, uses = [loss.grad_fn], []
    while nodes:
        node = nodes.pop()
        uses.extend([node.use] if hasattr(node, "use") else [])
        nodes.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
    assert len(uses) == 3 and all(use.inputs is None and use.output_grad is None for use in uses)
