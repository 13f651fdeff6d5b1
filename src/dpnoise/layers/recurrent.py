"""Recurrent layers built from ``nn.Linear`` maps, drop-in replacements for ``nn.RNN``, ``nn.LSTM`` and
``nn.GRU``.

torch's recurrent layers run their whole recurrence in one fused kernel, so no per-layer rule sees the
input-to-hidden and hidden-to-hidden maps.  Here each layer and direction is a :class:`RecurrentCell` of
two ``nn.Linear`` maps, ``ih`` (applied to the whole sequence at once) and ``hh`` (applied once per time
step: book-keeping sums a layer's uses per example), plus, for an LSTM with ``proj_size``, the projection
``proj``.  The recurrences are torch's (its documentation of ``nn.RNN``, ``nn.LSTM`` and ``nn.GRU``; Elman
1990, Hochreiter & Schmidhuber 1997, Cho et al. 2014, arXiv 1406.1078), with the same gate order
(LSTM: i, f, g, o; GRU: r, z, n), so the originals' weights are taken as they are
(:meth:`RecurrentLayer.from_module`).  Inputs are moved batch first before any map.  Packed sequences
are refused.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn
from torch.nn import functional as F

from dpnoise.layers.copying import copy_linear
from dpnoise.layers.errors import UnsupportedLayerError

#: the gates of each recurrence (the rows of its weights, in torch's order)
GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}

State = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


class RecurrentCell(nn.Module):
    """One layer and direction: ``ih`` (input -> gates), ``hh`` (hidden -> gates) and, for an LSTM with a
    projection, ``proj`` (cell output -> hidden)."""

    def __init__(self, input_size: int, hidden_size: int, gates: int, bias: bool, proj_size: int = 0,
                 **factory) -> None:
        super().__init__()
        recurrent_size = proj_size or hidden_size
        self.ih = nn.Linear(input_size, gates * hidden_size, bias=bias, **factory)
        self.hh = nn.Linear(recurrent_size, gates * hidden_size, bias=bias, **factory)
        self.proj = nn.Linear(hidden_size, proj_size, bias=False, **factory) if proj_size else None


class RecurrentLayer(nn.Module):
    """The arguments and forward of ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` (``mode``), the same outputs for
    the same weights; the cells are ``cells[layer * directions + direction]``."""

    mode = "RNN"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 nonlinearity: str = "tanh", proj_size: int = 0, device=None, dtype=None) -> None:
        super().__init__()
        if nonlinearity not in ("tanh", "relu"):
            raise UnsupportedLayerError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        if proj_size and self.mode != "LSTM":
            raise UnsupportedLayerError("proj_size is an LSTM option")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, dropout, bidirectional
        self.nonlinearity, self.proj_size = nonlinearity, proj_size
        directions = 2 if bidirectional else 1
        output_size = proj_size or hidden_size
        self.cells = nn.ModuleList(
            RecurrentCell(input_size if layer == 0 else directions * output_size, hidden_size, GATES[self.mode], bias,
                          proj_size, device=device, dtype=dtype)
            for layer in range(num_layers) for _ in range(directions))

    @classmethod
    def from_module(cls, original: nn.RNNBase) -> "RecurrentLayer":
        """A copy of ``original`` (configuration, weights, device, dtype, which weights train, training mode)."""
        weight = original.weight_ih_l0
        extra = {"nonlinearity": original.nonlinearity} if cls.mode == "RNN" else {}
        extra.update({"proj_size": original.proj_size} if cls.mode == "LSTM" else {})
        layer = cls(original.input_size, original.hidden_size, original.num_layers, original.bias,
                    original.batch_first, original.dropout, original.bidirectional, device=weight.device,
                    dtype=weight.dtype, **extra)
        directions = 2 if original.bidirectional else 1
        for index, cell in enumerate(layer.cells):
            suffix = f"l{index // directions}" + ("_reverse" if index % directions else "")
            for linear, kind in ((cell.ih, "ih"), (cell.hh, "hh")):
                source = getattr(original, f"weight_{kind}_{suffix}")
                copy_linear(linear, source, getattr(original, f"bias_{kind}_{suffix}", None), not source.requires_grad)
            if cell.proj is not None:
                source = getattr(original, f"weight_hr_{suffix}")
                copy_linear(cell.proj, source, None, not source.requires_grad)
        return layer.train(original.training)

    def forward(self, input: torch.Tensor, hx: Optional[State] = None) -> tuple[torch.Tensor, State]:
        if isinstance(input, nn.utils.rnn.PackedSequence):
            raise UnsupportedLayerError(f"dpnoise.layers.{type(self).__name__} takes padded tensors, not a "
                                        f"PackedSequence (pad it: torch.nn.utils.rnn.pad_packed_sequence)")
        unbatched = input.dim() == 2
        sequences = input.unsqueeze(0) if unbatched else (input if self.batch_first else input.transpose(0, 1))
        hidden, cell = self._initial_state(hx, sequences, unbatched)
        final_hidden, final_cell = [], []
        directions = 2 if self.bidirectional else 1
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                index = layer * directions + direction
                out, h, c = self._run(self.cells[index], sequences, hidden[index],
                                      None if cell is None else cell[index], reverse=direction == 1)
                outputs.append(out)
                final_hidden.append(h)
                final_cell.append(c)
            sequences = torch.cat(outputs, dim=-1)
            if self.dropout and layer < self.num_layers - 1:
                sequences = F.dropout(sequences, self.dropout, self.training)
        output = sequences.squeeze(0) if unbatched else (sequences if self.batch_first else sequences.transpose(0, 1))
        h_n = _final(final_hidden, unbatched)
        return (output, h_n) if self.mode != "LSTM" else (output, (h_n, _final(final_cell, unbatched)))

    def _initial_state(self, hx: Optional[State], sequences: torch.Tensor, unbatched: bool
                       ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(hidden, cell) as (layers x directions, batch, size) tensors; zeros where not given."""
        count = self.num_layers * (2 if self.bidirectional else 1)
        batch, like = sequences.shape[0], dict(dtype=sequences.dtype, device=sequences.device)
        if hx is None:
            hidden = torch.zeros(count, batch, self.proj_size or self.hidden_size, **like)
            cell = torch.zeros(count, batch, self.hidden_size, **like) if self.mode == "LSTM" else None
            return hidden, cell
        hidden, cell = hx if self.mode == "LSTM" else (hx, None)
        if unbatched:
            hidden, cell = hidden.unsqueeze(1), None if cell is None else cell.unsqueeze(1)
        return hidden, cell

    def _run(self, cell: RecurrentCell, sequences: torch.Tensor, h: torch.Tensor, c: Optional[torch.Tensor],
             reverse: bool) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """One direction of one layer over (batch, time, features): its outputs, last hidden and cell state."""
        projected = cell.ih(sequences)  # every time step's input map at once
        steps = range(sequences.shape[1] - 1, -1, -1) if reverse else range(sequences.shape[1])
        outputs: list[torch.Tensor] = [None] * sequences.shape[1]  # type: ignore[list-item]
        for t in steps:
            h, c = self._step(cell, projected[:, t], h, c)
            outputs[t] = h
        return torch.stack(outputs, dim=1), h, c

    def _step(self, cell: RecurrentCell, x_gates: torch.Tensor, h: torch.Tensor, c: Optional[torch.Tensor]
              ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        raise NotImplementedError


def _final(states: list[torch.Tensor], unbatched: bool) -> torch.Tensor:
    """Each layer's and direction's last state as torch gives them: (layers x directions, batch, size), or
    without the batch for an unbatched input."""
    stacked = torch.stack(states)
    return stacked.squeeze(1) if unbatched else stacked


class RNN(RecurrentLayer):
    """``nn.RNN``: h' = act(W_ih x + b_ih + W_hh h + b_hh), act tanh or ReLU."""

    mode = "RNN"

    def _step(self, cell, x_gates, h, c):
        pre = x_gates + cell.hh(h)
        return (torch.tanh(pre) if self.nonlinearity == "tanh" else torch.relu(pre)), None


class LSTM(RecurrentLayer):
    """``nn.LSTM``: gates i, f, g, o; c' = f c + i g, h' = o tanh(c') (projected by W_hr with ``proj_size``)."""

    mode = "LSTM"

    def _step(self, cell, x_gates, h, c):
        i, f, g, o = (x_gates + cell.hh(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (h if cell.proj is None else cell.proj(h)), c


class GRU(RecurrentLayer):
    """``nn.GRU``: r, z from W_i x + W_h h; n = tanh(W_in x + b_in + r (W_hn h + b_hn)); h' = (1 - z) n + z h."""

    mode = "GRU"

    def _step(self, cell, x_gates, h, c):
        x_r, x_z, x_n = x_gates.chunk(3, dim=-1)
        h_r, h_z, h_n = cell.hh(h).chunk(3, dim=-1)
        r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
        n = torch.tanh(x_n + r * h_n)
        return (1 - z) * n + z * h, None
