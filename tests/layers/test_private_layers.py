"""dpnoise.layers: each drop-in layer computes its torch original's function with the original's weights
(outputs, states, attention weights and parameter gradients), book-keeping gets its per-example gradients
exactly, and fix_model swaps the originals in."""

import itertools
import warnings

import pytest
import torch
from torch import nn

from dpnoise.layers import GRU, LSTM, RNN, MultiheadAttention, UnsupportedLayerError, fix_model
from dpnoise.training import make_private, verify_per_example_gradients

B, L, S, E = 3, 5, 4, 8


def attention_inputs(batch_first: bool, kdim: int = E, vdim: int = E, unbatched: bool = False):
    torch.manual_seed(1)
    def shaped(length, dim):
        if unbatched:
            return torch.randn(length, dim, dtype=torch.float64)
        return torch.randn(B, length, dim, dtype=torch.float64) if batch_first else torch.randn(
            length, B, dim, dtype=torch.float64)
    return shaped(L, E), shaped(S, kdim), shaped(S, vdim)


ATTENTION_CASES = [
    dict(layer={}, call={}),
    dict(layer=dict(batch_first=True), call=dict(average_attn_weights=False)),
    dict(layer=dict(kdim=6, vdim=7), call={}),
    dict(layer=dict(bias=False, add_zero_attn=True), call=dict(key_padding_mask="bool")),
    dict(layer=dict(batch_first=True), call=dict(attn_mask="float2d", key_padding_mask="float")),
    dict(layer={}, call=dict(attn_mask="bool3d")),
    dict(layer=dict(batch_first=True), call=dict(is_causal=True, attn_mask="causal", need_weights=False)),
    dict(layer={}, call=dict(unbatched=True)),
]


def masks(call: dict) -> dict:
    torch.manual_seed(2)
    out = {k: v for k, v in call.items() if k in ("average_attn_weights", "need_weights", "is_causal")}
    padding = call.get("key_padding_mask")
    if padding == "bool":
        out["key_padding_mask"] = torch.tensor([[False] * S, [False, True, False, True], [True, False, False, False]])
    elif padding == "float":
        out["key_padding_mask"] = torch.randn(B, S, dtype=torch.float64)
    attn = call.get("attn_mask")
    if attn == "float2d":
        out["attn_mask"] = torch.randn(L, S, dtype=torch.float64)
    elif attn == "bool3d":
        out["attn_mask"] = (torch.rand(B * 2, L, S) < 0.3).index_fill(2, torch.tensor([0]), False)  # none empty
    elif attn == "causal":
        out["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)[:, :S]
    return out


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: str(c))
def test_multihead_attention_equals_torchs_with_its_weights(case):
    torch.manual_seed(0)
    original = nn.MultiheadAttention(E, 2, **case["layer"]).double().eval()
    ours = MultiheadAttention.from_module(original)
    unbatched = case["call"].get("unbatched", False)
    q, k, v = attention_inputs(original.batch_first, original.kdim, original.vdim, unbatched)
    call = masks({k_: v_ for k_, v_ in case["call"].items() if k_ != "unbatched"})
    expected_out, expected_weights = original(q, k, v, **call)
    out, weights = ours(q, k, v, **call)
    torch.testing.assert_close(out, expected_out, rtol=1e-10, atol=1e-12)
    if expected_weights is None:
        assert weights is None
    else:
        torch.testing.assert_close(weights, expected_weights, rtol=1e-10, atol=1e-12)
    # the gradients of the projections, against the original's packed weights
    expected_out.square().sum().backward()
    out.square().sum().backward()
    if original._qkv_same_embed_dim:
        packed = torch.cat([ours.q_proj.weight.grad, ours.k_proj.weight.grad, ours.v_proj.weight.grad])
        torch.testing.assert_close(packed, original.in_proj_weight.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(ours.out_proj.weight.grad, original.out_proj.weight.grad, rtol=1e-9, atol=1e-12)


def test_multihead_attention_refuses_learned_key_and_value_rows():
    with pytest.raises(UnsupportedLayerError, match="add_bias_kv"):
        MultiheadAttention.from_module(nn.MultiheadAttention(E, 2, add_bias_kv=True))


RECURRENT_CASES = [
    (nn.RNN, RNN, dict()),
    (nn.RNN, RNN, dict(nonlinearity="relu", num_layers=2, bidirectional=True, batch_first=True)),
    (nn.LSTM, LSTM, dict()),
    (nn.LSTM, LSTM, dict(num_layers=2, bidirectional=True, bias=False)),
    (nn.LSTM, LSTM, dict(proj_size=3, batch_first=True)),
    (nn.GRU, GRU, dict()),
    (nn.GRU, GRU, dict(num_layers=2, bidirectional=True, batch_first=True)),
]


def states_close(actual, expected):
    for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                    expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kinds", RECURRENT_CASES, ids=lambda c: f"{c[0].__name__}-{c[2]}")
@pytest.mark.parametrize("shape", ["batched", "unbatched", "given-state"])
def test_recurrent_layers_equal_torchs_with_its_weights(kinds, shape):
    original_kind, ours_kind, options = kinds
    torch.manual_seed(0)
    original = original_kind(4, 5, **options).double().eval()
    ours = ours_kind.from_module(original)
    time_steps = 6
    if shape == "unbatched":
        x = torch.randn(time_steps, 4, dtype=torch.float64)
    else:
        x = torch.randn(B, time_steps, 4, dtype=torch.float64)
        x = x if original.batch_first else x.transpose(0, 1)
    state = None
    if shape == "given-state":
        layers = original.num_layers * (2 if original.bidirectional else 1)
        h = torch.randn(layers, B, original.proj_size or 5, dtype=torch.float64)
        state = (h, torch.randn(layers, B, 5, dtype=torch.float64)) if original_kind is nn.LSTM else h
    expected, expected_state = original(x, state)
    out, out_state = ours(x, state)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    states_close(out_state, expected_state)
    expected.square().sum().backward()
    out.square().sum().backward()
    directions = 2 if original.bidirectional else 1
    for index, cell in enumerate(ours.cells):  # every weight's gradient, against the original's by name
        suffix = f"l{index // directions}" + ("_reverse" if index % directions else "")
        pairs = [(cell.ih.weight, f"weight_ih_{suffix}"), (cell.hh.weight, f"weight_hh_{suffix}")]
        pairs += [(cell.ih.bias, f"bias_ih_{suffix}"), (cell.hh.bias, f"bias_hh_{suffix}")] if original.bias else []
        pairs += [(cell.proj.weight, f"weight_hr_{suffix}")] if cell.proj is not None else []
        for mine, name in pairs:
            torch.testing.assert_close(mine.grad, getattr(original, name).grad, rtol=1e-9, atol=1e-12)


def test_packed_sequences_are_refused():
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(3, 2, 4), [3, 2])
    with pytest.raises(UnsupportedLayerError, match="PackedSequence"):
        LSTM(4, 5)(packed)


class Tagger(nn.Module):
    """A sequence classifier with attention, an LSTM and a BatchNorm inside containers."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, E)
        self.blocks = nn.ModuleList([nn.MultiheadAttention(E, 2, batch_first=True)])
        self.encoder = nn.Sequential(nn.LSTM(E, E, batch_first=True))
        self.norm = nn.BatchNorm1d(E)
        self.head = nn.Linear(E, 3)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.blocks[0](h, h, h, need_weights=False)[0]
        h = self.encoder(h)[0].mean(dim=1)
        return self.head(self.norm(h))


def test_fix_model_swaps_the_layers_in_and_batch_norm_for_group_norm():
    torch.manual_seed(0)
    model = Tagger()
    attention, lstm = model.blocks[0], model.encoder[0]
    with pytest.warns(UserWarning, match="BatchNorm1d.8. becomes a GroupNorm"):
        fixed = fix_model(model)
    assert fixed is model
    assert isinstance(model.blocks[0], MultiheadAttention) and isinstance(model.encoder[0], LSTM)
    assert isinstance(model.norm, nn.GroupNorm) and model.norm.num_groups == 4
    x = torch.randn(B, L, E)
    torch.testing.assert_close(model.blocks[0](x, x, x)[0], attention(x, x, x)[0])
    torch.testing.assert_close(model.encoder[0](x)[0], lstm(x)[0])
    assert isinstance(fix_model(nn.GRU(2, 3)), GRU)  # a model that is one such layer


def test_a_fixed_model_trains_privately_with_book_keeping_exactly():
    """Every layer of the fixed model is book-kept; its per-example gradients equal one-example autograd."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = fix_model(Tagger())
    data = torch.utils.data.TensorDataset(torch.randn(64, L, 4), torch.randint(0, 3, (64,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the noise seed's warning
        private, optimizer, loader = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                  torch.utils.data.DataLoader(data, batch_size=16),
                                                  mechanism="gaussian", noise_multiplier=1.0, delta=1e-5, seed=0,
                                                  noise_seed=0, grad_sample_mode="bookkeeping")
    engine = optimizer.privacy_engine
    assert all(source.startswith("book-keeping") for source in engine.gradient_sources.values())
    assert engine.gradient_sources["encoder.0.cells.0.hh (Linear)"] == "book-keeping rule"
    x, y = next(itertools.islice(iter(loader), 1))
    report = verify_per_example_gradients(private, (x, y), examples=3, rtol=1e-6)
    assert report.skipped is None and report.exactness.error < 1e-6 and report.examples
    optimizer.zero_grad()
    nn.functional.cross_entropy(private(x), y).backward()
    optimizer.step()
    assert engine.steps == 1
