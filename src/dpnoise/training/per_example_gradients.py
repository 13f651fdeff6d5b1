"""Per-example gradients of one parameter, kept in factored form: their L1/L2 norms and clipped sum.

A layer applied to a sequence (input rows ``a_{i,t}``, output-gradient rows ``g_{i,t}`` of example
``i``) has the per-example weight gradient ``G_i = sum_t u_{i,t} v_{i,t}^T``, a sum of outer
products in the parameter's layout (``nn.Linear``: ``u = g, v = a``; Hugging Face's ``Conv1D``,
whose weight is transposed: ``u = a, v = g``; ``nn.Embedding``: ``u`` the one-hot row of the token
id, ``v = g``).  Every use of a parameter in one forward pass (a layer applied twice, or a weight
tied between layers) adds its rows to the same sum, so each example's uses are summed before the
norm.  From the rows, exactly (no approximation):

* L2, dense rows: the ghost norm ``||G_i||_F^2 = sum_{t,s} (u_t . u_s)(v_t . v_s)`` (Li et al.,
  arXiv 2110.05679, Sec. 4) where it is cheaper than materialising ``G_i``, i.e. when
  ``R (P + Q) <= P Q`` for ``R`` rows per example and a ``P x Q`` parameter, else ``G_i`` itself
  (Bu et al., arXiv 2210.00038, Sec. 3.2, the "mixed" choice per layer);
* one row per example (a dense layer on 2-D inputs): ``||u v^T||_p = ||u||_p ||v||_p`` (p = 1, 2);
* one-hot rows (embeddings): the rows of ``G_i`` are the sums of ``v_{i,t}`` over the positions
  with the same token id, computed only for the (example, id) pairs that occur (``unique`` +
  ``index_add_``); both norms from those;
* dense rows and one-hot rows on one parameter (GPT-2's tied embedding and output layer), L2:
  ``||D + E||^2 = ||D||^2 + ||E||^2 + 2 <D, E>`` with the cross term
  ``<u_t v_t^T, e_k w_s^T> = u_t[k] (v_t . w_s)``;
* L1 of several dense rows (it does not factorise): ``G_i`` materialised, a chunk of examples at a
  time.

Memory bound: a materialised or ghost computation holds at most
``max(P * Q, max_chunk_elements)`` elements (resp. ``max(2 R^2, max_chunk_elements)``) at once, on
top of the layer's rows, which the backward pass produced anyway.  The clipped sum over the batch is
one matrix product over the flattened rows, ``(f * U)^T V`` (book-keeping: Bu et al.), or an
``index_add_`` of ``f_i v_{i,t}`` into the rows of the embedding.

Privacy units (:mod:`dpnoise.training.privacy_units`): a unit's gradient is the sum of its examples'
gradients, ``G_u = sum_{i in u} G_i``.  Rows are regrouped per unit (a unit's rows side by side, units
of fewer examples padded with zero rows, which add nothing) and materialised gradients summed per
unit (:meth:`ParameterGradients.by_unit`), so every rule above gives per-unit norms and sums unchanged.

Everything is computed in float32 at least (float64 stays float64), whatever the dtype of the rows
(e.g. bfloat16 under ``torch.autocast``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import torch

#: Default bound on the elements of a materialised chunk of per-example gradients (or ghost Gram
#: matrices): 2^20 elements, 4 MiB in float32 (chunks that stay in cache are also the fastest: on
#: MiniLM's layers, L1 norms of chunks of 2^20 elements take half the time of chunks of 2^24).
MAX_CHUNK_ELEMENTS = 2**20


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype norms and sums are computed in: float32, or float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


@dataclass
class DenseRows:
    """``G_i = sum_r left[i, r] right[i, r]^T``: ``left`` ``(B, R, P)``, ``right`` ``(B, R, Q)``."""

    left: torch.Tensor
    right: torch.Tensor


@dataclass
class IndexedRows:
    """``G_i = sum_r e_{index[i, r]} right[i, r]^T`` for a ``rows x Q`` parameter (one-hot left vectors).

    ``index``: ``(B, R)`` integer row ids; ``right``: ``(B, R, Q)`` (rows that must not count, e.g. an
    embedding's ``padding_idx``, are zero).
    """

    index: torch.Tensor
    right: torch.Tensor
    rows: int


@dataclass
class MaterialisedGradients:
    """Per-example gradients ``(B, *layout)``; ``permutation`` takes a summed gradient from ``layout``
    to the parameter's axis order (None: ``layout`` is the parameter's shape)."""

    samples: torch.Tensor
    permutation: Optional[tuple[int, ...]] = None


Contribution = Union[DenseRows, IndexedRows, MaterialisedGradients]


@dataclass(frozen=True)
class UnitGrouping:
    """The privacy units of a batch of ``B`` examples: ``of_example[i]`` in ``0..count-1`` is example i's unit,
    ``slot[i]`` its place among its unit's examples (``0..size-1``; ``size``: the largest unit's examples)."""

    of_example: torch.Tensor
    slot: torch.Tensor
    count: int
    size: int

    @classmethod
    def of(cls, unit_ids: torch.Tensor) -> "UnitGrouping":
        """The grouping of a batch whose example i belongs to the unit ``unit_ids[i]`` (any integer ids)."""
        _, of_example, counts = torch.unique(unit_ids, return_inverse=True, return_counts=True)
        order = torch.argsort(of_example, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.empty_like(of_example)
        slot[order] = torch.arange(len(unit_ids), device=unit_ids.device) - starts[of_example[order]]
        return cls(of_example, slot, len(counts), int(counts.max()) if len(counts) else 0)

    def summed(self, samples: torch.Tensor) -> torch.Tensor:
        """``(B, ...)`` per-example values as ``(U, ...)`` sums over each unit's examples."""
        return samples.new_zeros((self.count, *samples.shape[1:])).index_add_(0, self.of_example, samples)

    def side_by_side(self, rows: torch.Tensor) -> torch.Tensor:
        """``(B, R, ...)`` rows as ``(U, size * R, ...)``: each unit's examples' rows side by side, the slots of
        smaller units zero (a zero row adds nothing to a sum of outer products; a zero id with a zero
        right-hand row adds nothing to an embedding's)."""
        grouped = rows.new_zeros((self.count, self.size, *rows.shape[1:]))
        grouped[self.of_example, self.slot] = rows
        return grouped.reshape(self.count, self.size * rows.shape[1], *rows.shape[2:])


class ParameterGradients:
    """Every example's gradient of one parameter, from all its uses in one forward pass.

    Args:
        shape: the parameter's shape.
        contributions: one per use (all of one kind: rows, or materialised gradients).
        max_chunk_elements: the memory bound of materialised chunks (module docstring).
    """

    def __init__(self, shape: torch.Size, contributions: Sequence[Contribution],
                 max_chunk_elements: int = MAX_CHUNK_ELEMENTS):
        self.shape = shape
        self.max_chunk_elements = max_chunk_elements
        dense = [c for c in contributions if isinstance(c, DenseRows)]
        indexed = [c for c in contributions if isinstance(c, IndexedRows)]
        materialised = [c for c in contributions if isinstance(c, MaterialisedGradients)]
        if materialised and (dense or indexed):
            raise ValueError("a parameter's per-example gradients are either rows or materialised, not both")
        self.dense = _concatenated(dense, lambda parts: DenseRows(torch.cat([c.left for c in parts], 1),
                                                                  torch.cat([c.right for c in parts], 1)))
        self.indexed = _concatenated(indexed, lambda parts: IndexedRows(torch.cat([c.index for c in parts], 1),
                                                                        torch.cat([c.right for c in parts], 1),
                                                                        parts[0].rows))
        self.materialised = None
        if materialised:
            samples = materialised[0].samples
            for more in materialised[1:]:
                samples = samples + more.samples
            self.materialised = MaterialisedGradients(samples, materialised[0].permutation)

    def of_examples(self, examples: Sequence[int]) -> "ParameterGradients":
        """The same gradients of ``examples`` only (their rows: nothing of the other examples is computed)."""
        parts: list[Contribution] = []
        if self.materialised is not None:
            rows = torch.as_tensor(list(examples), device=self.materialised.samples.device)
            parts.append(MaterialisedGradients(self.materialised.samples[rows], self.materialised.permutation))
        if self.dense is not None:
            rows = torch.as_tensor(list(examples), device=self.dense.left.device)
            parts.append(DenseRows(self.dense.left[rows], self.dense.right[rows]))
        if self.indexed is not None:
            rows = torch.as_tensor(list(examples), device=self.indexed.right.device)
            parts.append(IndexedRows(self.indexed.index[rows], self.indexed.right[rows], self.indexed.rows))
        return ParameterGradients(self.shape, parts, self.max_chunk_elements)

    def by_unit(self, units: "UnitGrouping") -> "ParameterGradients":
        """The same gradients summed per privacy unit: ``(U, ...)`` for the ``U`` units of ``units`` (the
        unit of each of the ``B`` examples), whose norms and clipped sums are the units'."""
        parts: list[Contribution] = []
        if self.materialised is not None:
            parts.append(MaterialisedGradients(units.summed(self.materialised.samples), self.materialised.permutation))
        if self.dense is not None:
            parts.append(DenseRows(units.side_by_side(self.dense.left), units.side_by_side(self.dense.right)))
        if self.indexed is not None:
            parts.append(IndexedRows(units.side_by_side(self.indexed.index), units.side_by_side(self.indexed.right),
                                     self.indexed.rows))
        return ParameterGradients(self.shape, parts, self.max_chunk_elements)

    def norm_power(self, norm_ord: int) -> torch.Tensor:
        """``(B,)`` per-example ``sum |G_i|^p`` over the parameter's entries (p = ``norm_ord``, 1 or 2)."""
        if self.materialised is not None:
            samples = self.materialised.samples
            return _entrywise_power(samples.reshape(len(samples), -1).to(compute_dtype(samples.dtype)), norm_ord, 1)
        dense, indexed = self.dense, self.indexed
        if indexed is None and dense.left.shape[1] == 1:
            return _factorised_power(dense, norm_ord)
        if dense is None:
            return indexed_norm_power(indexed, norm_ord)
        if norm_ord == 2 and ghost_is_cheaper(dense):
            power = ghost_squared_norms(dense, self.max_chunk_elements)
            if indexed is not None:
                power = power + indexed_norm_power(indexed, 2) + 2 * cross_inner_products(dense, indexed,
                                                                                           self.max_chunk_elements)
            return power.clamp(min=0)  # the ghost sum can round below 0 for a zero gradient
        return materialised_norm_power(dense, indexed, norm_ord, self.max_chunk_elements)

    def clipped_sum(self, factors: torch.Tensor) -> torch.Tensor:
        """``sum_i factors[i] * G_i`` in the parameter's shape (compute dtype)."""
        if self.materialised is not None:
            samples = self.materialised.samples
            dtype = compute_dtype(samples.dtype)
            summed = torch.einsum("i,i...->...", factors.to(dtype), samples.to(dtype))
            if self.materialised.permutation is not None:
                summed = summed.permute(self.materialised.permutation)
            return summed.contiguous().view(self.shape)
        summed = None
        if self.dense is not None:
            summed = dense_clipped_sum(self.dense, factors)
        if self.indexed is not None:
            summed = indexed_clipped_sum(self.indexed, factors, summed)
        return summed.view(self.shape)


def ghost_is_cheaper(rows: DenseRows) -> bool:
    """Whether the ghost norm (``~R^2 (P + Q)`` per example) costs less than materialising (``~R P Q``)."""
    _, r, p = rows.left.shape
    q = rows.right.shape[2]
    return r * (p + q) <= p * q


def ghost_squared_norms(rows: DenseRows, max_chunk_elements: int = MAX_CHUNK_ELEMENTS) -> torch.Tensor:
    """``(B,)`` ``||sum_r u_r v_r^T||_F^2 = sum_{r,s} (u_r . u_s)(v_r . v_s)`` (two ``(R, R)`` Gram matrices)."""
    batch, r, _ = rows.left.shape
    dtype = compute_dtype(rows.left.dtype)
    out = torch.empty(batch, dtype=dtype, device=rows.left.device)
    for chunk in example_chunks(batch, 2 * r * r, max_chunk_elements):
        u, v = rows.left[chunk].to(dtype), rows.right[chunk].to(dtype)
        out[chunk] = (torch.bmm(u, u.transpose(1, 2)) * torch.bmm(v, v.transpose(1, 2))).sum(dim=(1, 2))
    return out


def indexed_norm_power(rows: IndexedRows, norm_ord: int) -> torch.Tensor:
    """``(B,)`` ``sum |G_i|^p`` of one-hot rows: each example's rows summed per distinct row id."""
    batch, r = rows.index.shape
    q = rows.right.shape[2]
    dtype = compute_dtype(rows.right.dtype)
    keys = (torch.arange(batch, device=rows.index.device).unsqueeze(1) * rows.rows + rows.index).reshape(-1)
    pairs, inverse = torch.unique(keys, return_inverse=True)
    summed = torch.zeros(len(pairs), q, dtype=dtype, device=rows.right.device)
    summed.index_add_(0, inverse, rows.right.reshape(batch * r, q).to(dtype))
    per_pair = _entrywise_power(summed, norm_ord, 1)
    return torch.zeros(batch, dtype=dtype, device=summed.device).index_add_(0, pairs // rows.rows, per_pair)


def cross_inner_products(dense: DenseRows, indexed: IndexedRows,
                         max_chunk_elements: int = MAX_CHUNK_ELEMENTS) -> torch.Tensor:
    """``(B,)`` ``<sum_t u_t v_t^T, sum_s e_{k_s} w_s^T> = sum_{t,s} u_t[k_s] (v_t . w_s)``."""
    batch, r_dense, _ = dense.left.shape
    r_indexed = indexed.index.shape[1]
    dtype = compute_dtype(dense.left.dtype)
    out = torch.empty(batch, dtype=dtype, device=dense.left.device)
    for chunk in example_chunks(batch, 2 * r_dense * r_indexed, max_chunk_elements):
        index = indexed.index[chunk]
        picked = dense.left[chunk].gather(2, index.unsqueeze(1).expand(-1, r_dense, -1)).to(dtype)
        products = torch.bmm(dense.right[chunk].to(dtype), indexed.right[chunk].to(dtype).transpose(1, 2))
        out[chunk] = (picked * products).sum(dim=(1, 2))
    return out


def materialised_norm_power(dense: DenseRows, indexed: Optional[IndexedRows], norm_ord: int,
                            max_chunk_elements: int = MAX_CHUNK_ELEMENTS) -> torch.Tensor:
    """``(B,)`` ``sum |G_i|^p`` with ``G_i`` built, a chunk of examples at a time (``<= max(P Q, budget)``
    elements at once)."""
    batch, _, p = dense.left.shape
    q = dense.right.shape[2]
    dtype = compute_dtype(dense.left.dtype)
    out = torch.empty(batch, dtype=dtype, device=dense.left.device)
    for chunk in example_chunks(batch, p * q, max_chunk_elements):
        gradients = torch.bmm(dense.left[chunk].to(dtype).transpose(1, 2), dense.right[chunk].to(dtype))
        if indexed is not None:
            size = len(gradients)
            rows = torch.arange(size, device=gradients.device).unsqueeze(1) * p + indexed.index[chunk]
            gradients.view(size * p, q).index_add_(0, rows.reshape(-1), indexed.right[chunk].reshape(-1, q).to(dtype))
        out[chunk] = _entrywise_power(gradients.reshape(len(gradients), -1), norm_ord, 1)
    return out


def dense_clipped_sum(rows: DenseRows, factors: torch.Tensor) -> torch.Tensor:
    """``sum_i f_i sum_r u_{i,r} v_{i,r}^T`` as one ``(P, B R) @ (B R, Q)`` product (the narrower side scaled)."""
    batch, r, p = rows.left.shape
    q = rows.right.shape[2]
    dtype = compute_dtype(rows.left.dtype)
    scale = factors.to(dtype).view(batch, 1, 1)
    left, right = rows.left.to(dtype), rows.right.to(dtype)
    if p <= q:
        left = left * scale
    else:
        right = right * scale
    return left.reshape(batch * r, p).t() @ right.reshape(batch * r, q)


def indexed_clipped_sum(rows: IndexedRows, factors: torch.Tensor,
                        into: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``sum_i f_i sum_r e_{index[i,r]} right[i,r]^T`` by ``index_add_`` (added to ``into`` when given)."""
    batch, r, q = rows.right.shape
    dtype = compute_dtype(rows.right.dtype)
    if into is None:
        into = torch.zeros(rows.rows, q, dtype=dtype, device=rows.right.device)
    scaled = rows.right.to(dtype) * factors.to(dtype).view(batch, 1, 1)
    return into.index_add_(0, rows.index.reshape(-1), scaled.reshape(batch * r, q))


def example_chunks(batch: int, elements_per_example: int, max_chunk_elements: int) -> Iterator[slice]:
    """Consecutive slices of the batch with ``size * elements_per_example <= max_chunk_elements``
    (at least one example each)."""
    size = max(1, max_chunk_elements // max(1, elements_per_example))
    for start in range(0, batch, size):
        yield slice(start, min(start + size, batch))


def _concatenated(parts: list, concatenate) -> Optional[Union[DenseRows, IndexedRows]]:
    """The rows of all ``parts`` (uses of one parameter) as one set of rows; a single use as it is (no copy)."""
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else concatenate(parts)


def _factorised_power(rows: DenseRows, norm_ord: int) -> torch.Tensor:
    """``||u v^T||_p^p = ||u||_p^p ||v||_p^p`` for one row per example."""
    dtype = compute_dtype(rows.left.dtype)
    return _entrywise_power(rows.left[:, 0].to(dtype), norm_ord, 1) * _entrywise_power(rows.right[:, 0].to(dtype),
                                                                                       norm_ord, 1)


def _entrywise_power(values: torch.Tensor, norm_ord: int, dim: int) -> torch.Tensor:
    """``sum |x|^p`` along ``dim`` (p = 1, 2), by one fused reduction (no temporary ``|x|`` or ``x^2``)."""
    norms = torch.linalg.vector_norm(values, norm_ord, dim=dim)
    return norms if norm_ord == 1 else norms.square()
