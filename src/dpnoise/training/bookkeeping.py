"""Per-example clipping with one backward pass and without materialising dense layers' gradients.

Book-keeping (Bu et al., "Differentially private optimization on large model at small cost",
arXiv 2210.00038): during the one backward pass, every trainable layer's input and output gradient
are kept; the per-example norms and the clipped sum over the batch are then computed from them,
exactly.  A layer with a registered rule (:mod:`dpnoise.training.bookkeeping_rules`: ``nn.Linear``,
Hugging Face's ``Conv1D``, ``nn.Embedding``, ``nn.LayerNorm``, Hugging Face's RMSNorms, and the elementwise
layers of :mod:`dpnoise.layers`: ``Scale``, ``Shift``, ``ClsToken``, ``PositionEmbedding``) runs its forward
pass through a function that back-propagates to its input only, so that autograd never computes the batch's
summed parameter gradients that DP training discards; its per-example gradients stay factorised
(:mod:`dpnoise.training.per_example_gradients`: ghost norms of sequences, the outer-product
factorisation of 2-D inputs, token-id sums of embeddings).  The calls of the other supported
layers (:data:`RECORDED_LAYERS`) are recorded as they run:

* ``Conv2d`` (any groups, padding, ``padding="same"``, every padding mode): one batched matmul
  over a channels-last sliding-window view of its input, padded as the layer pads it
  (:func:`conv2d_per_example_gradients`);
* ``nn.EmbeddingBag`` (modes "sum", "mean", "max"; 1-D ids with offsets or 2-D ids;
  ``per_sample_weights``, ``padding_idx``, ``include_last_offset``): token-id rows per bag
  (:func:`~dpnoise.training.grad_samplers.embedding_bag_rows`);
* ``ConvTranspose1d``, ``ConvTranspose2d`` (every stride, padding, output padding, dilation and groups): the
  weight gradient of the ordinary convolution of the zero-padded output gradient whose output gradient is the
  input, by the same batched matmul as ``Conv2d``
  (:func:`~dpnoise.training.grad_samplers.conv_transpose_per_example_gradients`);
* ``Conv1d``, ``Conv3d`` (as ``Conv2d``), GroupNorm, RMSNorm, InstanceNorm1d/2d/3d, PReLU (one slope or
  one per channel: ``sum min(0, x) g`` per channel): the grad samplers the hooks use
  (:data:`~dpnoise.training.grad_samplers.GRAD_SAMPLERS`: Opacus's, with convolutions sampled exactly
  in every padding mode, and dpnoise's for the layers Opacus has none for);
* Hugging Face's ``ViTEmbeddings`` (the CLS token and position embeddings it holds as bare parameters; with
  dropout too): a captured source (:mod:`~dpnoise.training.captured_sources`, registered by class name where
  the layer has the structure it reads).  The layer runs as it is (its patch ``Conv2d`` keeps its own recorded
  source); the gradient at the input of its dropout, captured in the backward pass, is example i's gradient of
  the position embeddings, its first position that of the CLS token.  Its calls with
  ``interpolate_pos_encoding=True`` are re-run per example as below; ``bool_masked_pos`` is refused at the call;
* any other trainable layer (RMSNorm variants without a rule, ``ConvTranspose3d``, a layer of the user's own
  such as a module holding a learned scale, gate, CLS token or position embeddings as bare parameters): that
  layer alone, re-run per example by ``torch.func``
  (:func:`~dpnoise.training.layer_functorch.layer_per_example_gradients`); it may take keyword
  arguments that are not tensors.  Such a module's parameters cannot be given a rule by their class,
  since its forward may use them in any way; written with :mod:`dpnoise.layers`' ``Scale``, ``Shift``,
  ``ClsToken`` and ``PositionEmbedding`` instead, they take those layers' rules.

Opacus's DP recurrent layers (hooks only) and ``nn.RNN``, ``nn.LSTM``, ``nn.GRU`` and embeddings with
``max_norm`` or ``scale_grad_by_freq`` (refused for both sources:
:func:`~dpnoise.training.grad_samplers.per_example_gradient_problems`) are what book-keeping does not
cover (:func:`unsupported_bookkeeping_layers`); ``grad_sample_mode="auto"`` then takes the whole
model's per-example gradients from the hooks, with a warning that names them.
:func:`gradient_sources` says where each layer's per-example gradients come from.

Exactness with models as they come (Hugging Face's among them), checked on every training call of a
trainable layer (:class:`LayerInputs`, for Opacus's hooks too):

* a layer whose input has batch size 1 while the model is called on B != 1 examples (BERT's and
  GPT-2's ``position_ids`` buffer of shape ``(1, T)``) is taken to be broadcast over the batch: its
  input is expanded to B identical rows, so that each example gets its own output gradient and its
  own per-example gradient;
* a layer whose input has another leading dimension than the batch, or none (nanoGPT's position
  embedding ``wpe(torch.arange(t))``, T5's ``relative_attention_bias`` on ``(q_len, k_len)``), or
  that is called with arguments its per-example gradients would not read, is refused at that call,
  naming its path;
* a trainable layer that the loss does not reach (BERT's pooler when a head reads the first token's
  hidden state) has a zero gradient, as in non-private training;
* the uses of a parameter in one forward pass (a layer applied twice, GPT-2's embedding tied to its
  output layer) are summed per example before the norm;
* a gradient that reaches a book-kept parameter other than through its layer's forward (a direct
  use of ``layer.weight``, a forward pass in evaluation mode) is refused at the step, never
  silently left out of the clipping;
* under ``torch.autocast`` the norms and sums are computed in float32.

The clipped sums equal one-example-at-a-time autograd's (tests compare L1 and L2 norms and clipped
sums for every layer type and for tiny BERT and GPT-2 models).  On the tutorial CNN a DP step takes
about 0.68x the time it takes with Opacus's hooks (``benchmarks/bench_training.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Optional, Sequence

import torch
from opacus.utils.module_utils import trainable_modules
from torch import nn
from torch.utils.hooks import RemovableHandle

from dpnoise.training.batches import leading_size
from dpnoise.training.bookkeeping_rules import BookkeepingRule, bookkeeping_rule
from dpnoise.training.captured_sources import CAPTURED_GRADIENT, CapturedSource, captured_source
from dpnoise.training.errors import EngineStateError, InvalidTrainingOptionError, UnsupportedLayerError
from dpnoise.training.forwarding import ModelForwarding
from dpnoise.training.grad_samplers import (
    GRAD_SAMPLERS,
    OPACUS_RECURRENT_LAYERS,
    bag_count,
    embedding_bag_call,
    embedding_bag_rows,
    extra_arguments,
    conv_transpose_per_example_gradients,
    padded_conv_input,
    per_example_gradient_problems,
    window_weight_gradients,
)
from dpnoise.training.layer_functorch import layer_per_example_gradients
from dpnoise.training.sharding import full_zeros
from dpnoise.training.per_example_gradients import (
    MAX_CHUNK_ELEMENTS,
    Contribution,
    DenseRows,
    MaterialisedGradients,
    ParameterGradients,
    UnitGrouping,
    compute_dtype,
    dense_clipped_sum,
)

#: the window gradients give weights as (out, kh, kw, in) (transposed convolutions: (in, kh, kw, out), 1-D ones with
#: kh = 1); this permutes them to the parameter's (out, in, kh, kw) (resp. (in, out, kh, kw), (in, out, kw))
CONV_WEIGHT_PERMUTATION = (0, 3, 1, 2)

#: Layer types without a rule whose calls book-keeping records (exact types, batch first, one tensor out):
#: Conv2d's and the transposed convolutions' per-example gradients come from :data:`WINDOW_GRADIENTS`,
#: EmbeddingBag's from :func:`~dpnoise.training.grad_samplers.embedding_bag_rows` (token-id rows), the others'
#: from :data:`~dpnoise.training.grad_samplers.GRAD_SAMPLERS`.  Other layers (e.g. Opacus's RNN layers,
#: whose batch is not on dimension 0) are left to ``GradSampleModule``.
RECORDED_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.GroupNorm, nn.RMSNorm,
                   nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.PReLU, nn.EmbeddingBag)


def factorised_norms(activations: torch.Tensor, backprops: torch.Tensor, norm_ord: int,
                     with_bias: bool) -> torch.Tensor:
    """Per-example norms ``||g_i a_i^T||_p`` (with the bias gradient ``g_i``) of a dense layer on 2-D inputs.

    ``||g a^T||_p = ||g||_p ||a||_p`` (p = 1, 2).  ``activations``: ``(batch, d_in)``, ``backprops``:
    ``(batch, d_out)``; returns ``(batch,)`` norms over the layer's parameters.
    """
    _check_norm_ord(norm_ord)
    power = ParameterGradients(torch.Size((backprops.shape[1], activations.shape[1])),
                               [DenseRows(backprops.unsqueeze(1), activations.unsqueeze(1))]).norm_power(norm_ord)
    if with_bias:
        power = power + ParameterGradients(backprops.shape[1:], [MaterialisedGradients(backprops)]).norm_power(norm_ord)
    return power.pow(1 / norm_ord)


def factorised_clipped_sum(activations: torch.Tensor, backprops: torch.Tensor,
                           factors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_i f_i g_i a_i^T, sum_i f_i g_i)``: the clipped weight and bias sums of a dense layer on
    2-D inputs, in float32 at least."""
    weight = dense_clipped_sum(DenseRows(backprops.unsqueeze(1), activations.unsqueeze(1)), factors)
    dtype = compute_dtype(backprops.dtype)
    return weight, factors.to(dtype) @ backprops.to(dtype)


def conv2d_per_example_gradients(layer: nn.Conv2d, activations: torch.Tensor,
                                 backprops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example (weight, bias) gradients of a ``Conv2d`` (any ``groups``, padding and padding mode).

    Weight: :func:`~dpnoise.training.grad_samplers.window_weight_gradients` on the input padded as the layer pads
    it (:func:`~dpnoise.training.grad_samplers.padded_conv_input`), ``(batch, out, kh, kw, in / groups)`` (see
    :data:`CONV_WEIGHT_PERMUTATION`); bias: ``sum_{h,w} g_i[o, h, w]``, ``(batch, out)``.
    """
    weight = window_weight_gradients(padded_conv_input(layer, activations), backprops, layer.kernel_size,
                                     layer.stride, layer.dilation, layer.groups)
    return weight, backprops.sum(dim=(2, 3))


#: recorded layer types whose (weight, bias) per-example gradients come as sliding-window products, the weight's
#: laid out as :data:`CONV_WEIGHT_PERMUTATION` undoes
WINDOW_GRADIENTS = {nn.Conv2d: conv2d_per_example_gradients,
                    nn.ConvTranspose1d: conv_transpose_per_example_gradients,
                    nn.ConvTranspose2d: conv_transpose_per_example_gradients}


def layer_path(name: str, layer: nn.Module) -> str:
    """How messages name a layer: ``"<path in the model> (<type>)"``, e.g. ``"transformer.wpe (Embedding)"``."""
    return f"{name or '<model>'} ({type(layer).__name__})"


def unsupported_bookkeeping_layers(module: nn.Module) -> list[str]:
    """``"<path> (<type>): <why>"`` for each trainable layer (and shared parameter) book-keeping does not
    handle (empty: the model is supported)."""
    problems = []
    for name, layer in trainable_modules(module):
        path = layer_path(name, layer)
        rule = bookkeeping_rule(layer)
        reasons = per_example_gradient_problems(layer)
        if rule is not None:
            reasons += rule.problems(layer)
            if "forward" in layer.__dict__:
                reasons.append("its forward is replaced on the instance (e.g. by another library's hooks)")
        elif isinstance(layer, OPACUS_RECURRENT_LAYERS):
            reasons.append("Opacus's DP recurrent layers call their linear maps once per time step, on the examples "
                           "still running; book-keeping needs one call on the whole batch")
        problems.extend(f"{path}: {reason}" for reason in reasons)
    return problems + _shared_parameter_problems(module)


def gradient_sources(module: nn.Module, grad_sample_mode: str) -> dict[str, str]:
    """Where each trainable layer's per-example gradients come from, by ``"<path> (<type>)"``.

    ``grad_sample_mode="bookkeeping"``: "book-keeping rule" (a registered rule), "book-keeping,
    materialised" (a recorded call, its gradients built by a grad sampler or
    :func:`conv2d_per_example_gradients`), "book-keeping, token-id rows" (``nn.EmbeddingBag``),
    "book-keeping, captured gradient" (a library module with a captured source,
    :mod:`~dpnoise.training.captured_sources`: ``ViTEmbeddings``) or "book-keeping, per-layer torch.func"
    (any other layer, re-run alone per example).
    ``"hooks"`` (:class:`~dpnoise.training.grad_samplers.ExactGradSampleModule`): "hooks, grad sampler"
    (Opacus's DP recurrent layers too: their ``RNNLinear`` layers') or "hooks, functorch" (no grad
    sampler: the layer, and the layers inside it, are differentiated per example by ``torch.func``).
    """
    sources: dict[str, str] = {}
    functorch_paths: list[str] = []
    for name, layer in trainable_modules(module):
        if grad_sample_mode == "bookkeeping":
            source = ("book-keeping rule" if bookkeeping_rule(layer) is not None
                      else "book-keeping, token-id rows" if type(layer) is nn.EmbeddingBag
                      else CAPTURED_GRADIENT if captured_source(layer) is not None
                      else "book-keeping, per-layer torch.func" if _rerun_per_example(layer)
                      else "book-keeping, materialised")
        elif any(name.startswith(f"{outer}.") for outer in functorch_paths):
            source = "hooks, functorch"
        elif type(layer) in GRAD_SAMPLERS or isinstance(layer, OPACUS_RECURRENT_LAYERS):
            source = "hooks, grad sampler"
        else:
            source = "hooks, functorch"
            functorch_paths.append(name)
        sources[layer_path(name, layer)] = source
    return sources


def _rerun_per_example(layer: nn.Module) -> bool:
    """Whether book-keeping may get ``layer``'s per-example gradients by re-running it alone per example
    (no rule, no recorded source of its own; a layer with a captured source is re-run on the calls its
    source does not serve)."""
    return bookkeeping_rule(layer) is None and type(layer) not in RECORDED_LAYERS


def _shared_parameter_problems(module: nn.Module) -> list[str]:
    """Trainable parameters shared by layers whose per-example gradients come in different forms."""
    owners: dict[nn.Parameter, list[tuple[str, nn.Module]]] = {}
    for name, layer in trainable_modules(module):
        for p in layer.parameters(recurse=False):
            if p.requires_grad:
                owners.setdefault(p, []).append((name or "<model>", layer))
    names = _parameter_names(module)
    problems = []
    for p, layers in owners.items():
        forms = {_gradient_form(layer, p) for _, layer in layers}
        if len(forms) > 1:
            used_by = ", ".join(f"{name} ({type(layer).__name__})" for name, layer in layers)
            problems.append(f"parameter {names[p]} is shared by {used_by}, whose per-example gradients book-keeping "
                            f"cannot add up")
    return problems


def _gradient_form(layer: nn.Module, p: nn.Parameter) -> str:
    """How book-keeping holds ``layer``'s per-example gradients of ``p``: rows of outer products
    (weights of rule layers, EmbeddingBag's), a rule's materialised gradients, or a grad sampler's."""
    rule = bookkeeping_rule(layer)
    if rule is None:
        return "rows" if type(layer) is nn.EmbeddingBag else "grad sampler"
    return "rows" if p is getattr(layer, "weight", None) and rule.factorises_weight else "materialised"


def _parameter_names(module: nn.Module) -> dict[nn.Parameter, str]:
    """Each parameter's first qualified name in ``module``."""
    names: dict[nn.Parameter, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(p, name)
    return names


def _recording(layer: nn.Module) -> bool:
    """Book-keeping records training-mode calls with autograd on."""
    return layer.training and torch.is_grad_enabled()


def _call_batch_size(layer: nn.Module, args: tuple, kwargs: dict) -> Optional[int]:
    """The number of examples in a call of ``layer``: its number of bags for an ``nn.EmbeddingBag``, else
    the leading dimension of its first tensor argument (None: no tensor, or a scalar first)."""
    if type(layer) is nn.EmbeddingBag:
        return bag_count(layer, *embedding_bag_call(layer, args, kwargs))
    return leading_size((args, kwargs))


class LayerInputs:
    """Checks every training call of a trainable layer, and gives each example its own input.

    A forward pre-hook on the model reads the batch size B of each training call (the leading
    dimension of its first tensor argument, positional or keyword; an ``nn.EmbeddingBag`` model's
    number of bags) and counts the calls; a forward pre-hook on each of ``layers`` then:

    * refuses a call with arguments that per-example gradients would not read
      (:func:`~dpnoise.training.grad_samplers.extra_arguments`; ``rerun_layers``, which book-keeping
      re-runs per example with the same keywords, may take keywords that hold no tensor);
    * passes an ``nn.EmbeddingBag`` its ids as 1-D ids with offsets, positionally
      (:func:`~dpnoise.training.grad_samplers.embedding_bag_call`: the same call);
    * expands an input of leading dimension 1 to B rows when B != 1 (no copy: ``expand``).  Such an
      input is taken to be broadcast over the batch (BERT's and GPT-2's ``position_ids`` buffer of
      shape ``(1, T)``): the layer's output then has B identical rows, each of which receives only
      its own example's output gradient, so that per-example gradients of a broadcast layer are
      exact.  This assumes, as broadcasting does, that the batch-size-1 output combines with tensors
      whose leading dimension is the batch (Hugging Face's position embeddings are added to the
      token embeddings);
    * refuses an input of any other leading dimension than B, or without one (a scalar): such an
      input is not one row per example, and neither gradient source can tell the examples' gradients
      apart (nanoGPT's ``wpe(torch.arange(t))``).  When t equals B, shapes cannot tell.

    Only training-mode calls with autograd on are touched, none while :attr:`paused`, and not those
    of Opacus's DP recurrent layers (:data:`~dpnoise.training.grad_samplers.OPACUS_RECURRENT_LAYERS`,
    which handle their own batches); errors name the layer's path.
    """

    def __init__(self, module: nn.Module, layers: list[tuple[str, nn.Module]], rerun_layers: Sequence[nn.Module] = ()):
        #: batch size of the model's last training call (None before one)
        self.batch_size: Optional[int] = None
        #: training calls of the model so far
        self.forward_passes = 0
        #: while True, calls are neither counted nor checked
        self.paused = False
        self._rerun_layers = set(rerun_layers)
        self._handles = [module.register_forward_pre_hook(self._read_batch_size, with_kwargs=True)]
        self._handles.extend(layer.register_forward_pre_hook(partial(self._check, layer_path(name, layer)),
                                                             with_kwargs=True) for name, layer in layers)

    def _active(self, layer: nn.Module) -> bool:
        return not self.paused and _recording(layer)

    def _read_batch_size(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._active(module):
            self.forward_passes += 1
            self.batch_size = _call_batch_size(module, args, kwargs)

    def _check(self, path: str, layer: nn.Module, args: tuple, kwargs: dict) -> Optional[tuple[tuple, dict]]:
        if not self._active(layer):
            return None
        extra = extra_arguments(layer, args, kwargs, constant_keywords=layer in self._rerun_layers)
        if extra is not None:
            raise UnsupportedLayerError(
                f"{path} is called with {extra}, which its per-example gradients would not read (grad samplers and "
                f"functorch read a layer's first input only): call it on its input alone, e.g. by moving the rest "
                f"into the layer's own attributes or into a layer without trainable parameters")
        if type(layer) is nn.EmbeddingBag:
            args, kwargs = embedding_bag_call(layer, args, kwargs), {}
        batch, size = self.batch_size, _call_batch_size(layer, args, kwargs)
        if batch is None or size == batch or not args or not isinstance(args[0], torch.Tensor):
            return args, kwargs
        if size == 1 and type(layer) is not nn.EmbeddingBag:
            return (args[0].expand(batch, *args[0].shape[1:]), *args[1:]), kwargs
        found = ("a scalar" if size is None else f"{size} bags" if type(layer) is nn.EmbeddingBag
                 else f"leading dimension {size}")
        raise UnsupportedLayerError(
            f"{path}: its input has {found} in a call of the model on {batch} examples (the leading dimension of "
            f"the model's first tensor argument), so neither gradient source can tell its examples' gradients apart: "
            f"per-example clipping needs the batch on dimension 0 of every trainable layer's input. If its input has "
            f"no batch dimension, being shared by all examples (positions pos = torch.arange(t), say), expand it "
            f"over the batch: layer(pos[None].expand(B, -1)), e.g. self.wpe(pos.expand(B, t))")

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def check_layer_inputs(module: nn.Module, rerun_layers: Sequence[nn.Module] = ()) -> LayerInputs:
    """:class:`LayerInputs` on the trainable layers of ``module`` (for Opacus's ``GradSampleModule``,
    which records layer inputs in forward hooks, after these pre-hooks); ``rerun_layers``: those
    book-keeping re-runs per example."""
    return LayerInputs(module, [(name, layer) for name, layer in trainable_modules(module)
                                if not isinstance(layer, OPACUS_RECURRENT_LAYERS)], rerun_layers)


@dataclass(eq=False)
class LayerUse:
    """One call of a trainable layer in a recorded forward pass, and its output gradient."""

    layer: nn.Module
    #: the layer's rule (None: a recorded layer, see :data:`RECORDED_LAYERS`)
    rule: Optional[BookkeepingRule]
    #: the call's positional inputs (a rule layer's: its one input; None once released)
    inputs: Optional[tuple[torch.Tensor, ...]]
    #: which training call of the model it belongs to
    forward_pass: int
    #: its number of examples (None: its input has no leading dimension)
    batch_size: Optional[int]
    #: the call's keyword arguments (constants; a layer re-run per example only)
    keywords: Optional[dict] = None
    #: the captured source of the call (None: another source); its output gradient is then the gradient at the
    #: capture point's input
    source: Optional[CapturedSource] = None
    output_grad: Optional[torch.Tensor] = None
    backward_passes: int = 0

    def receive(self, output_grad: torch.Tensor) -> None:
        if self.inputs is not None:  # released uses (a graph kept past its step) record nothing
            self.backward_passes += 1
            self.output_grad = output_grad.detach()

    def release(self) -> None:
        """Drop the tensors (the autograd graph, which may outlive the step, still refers to the use)."""
        self.inputs = self.output_grad = self.keywords = None


@dataclass(eq=False)
class _CapturedCall:
    """A call of a layer with a captured source that the source serves, between the layer's forward pre-hook
    and forward hook: its inputs, and its use once the capture point has run."""

    inputs: tuple
    use: Optional[LayerUse] = None


class _BookkeptCall(torch.autograd.Function):
    """A rule layer's call: the rule's output; backward records the output gradient and returns
    the input gradient only (no parameter gradient: the parameters are inputs only so that the
    output requires grad)."""

    @staticmethod
    def forward(ctx, use: LayerUse, inputs: torch.Tensor, *parameters: nn.Parameter) -> torch.Tensor:
        ctx.use, ctx.parameters = use, len(parameters)
        ctx.save_for_backward(inputs if ctx.needs_input_grad[1] else None)  # freed by autograd after backward
        return use.rule.forward(use.layer, inputs)

    @staticmethod
    def backward(ctx, output_grad: torch.Tensor):
        use = ctx.use
        use.receive(output_grad)
        inputs_grad = None
        if ctx.needs_input_grad[1]:
            inputs_grad = use.rule.input_gradient(use.layer, ctx.saved_tensors[0], output_grad)
        return (None, inputs_grad, *([None] * ctx.parameters))


class _BookkeptForward:
    """The forward of a rule layer while it is book-kept (set on the instance; deep copies stay consistent)."""

    def __init__(self, keeper: "BookkeepingModule", layer: nn.Module, rule: BookkeepingRule):
        self.keeper, self.layer, self.rule = keeper, layer, rule

    def __call__(self, inputs: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        layer = self.layer
        if args or kwargs or not self.keeper.records(layer):
            return type(layer).forward(layer, inputs, *args, **kwargs)
        self.keeper.watch_swapped_parameters(layer)
        use = self.keeper.record_use(layer, self.rule, (inputs,))
        return _BookkeptCall.apply(use, inputs, *(p for p in layer.parameters(recurse=False) if p.requires_grad))


class BookkeepingModule(ModelForwarding, nn.Module):
    """Wraps a model; records, per backward pass, what per-example clipping needs (module docstring).

    ``loss_reduction="mean"``: the loss is the batch mean (as with ``GradSampleModule``), so output
    gradients are multiplied by the batch size.  Each step must have exactly one forward and one
    backward pass through the model (Poisson batches are never accumulated); anything else raises
    instead of mis-clipping.  ``max_chunk_elements`` bounds the memory of per-example gradients
    that are materialised (L1 norms of sequence layers; see
    :mod:`dpnoise.training.per_example_gradients`).  :meth:`paused` runs the wrapped model as if it
    were not wrapped (e.g. for a reference gradient by plain autograd).
    """

    def __init__(self, module: nn.Module, max_chunk_elements: int = MAX_CHUNK_ELEMENTS):
        super().__init__()
        unsupported = unsupported_bookkeeping_layers(module)
        if unsupported:
            raise UnsupportedLayerError("book-keeping clipping does not support: " + ", ".join(unsupported))
        self._module = module
        self.max_chunk_elements = max_chunk_elements
        layers = [layer for _, layer in trainable_modules(module)]
        self._parameter_names = _parameter_names(module)
        self._layer_names = {layer: layer_path(name, layer) for name, layer in trainable_modules(module)}
        self._layer_parameters = {p for layer in layers for p in layer.parameters(recurse=False)}
        #: each layer's parameters by attribute name, as registered now: the ones the optimizer steps (under
        #: fully_shard the sharded DTensors, which FSDP swaps for all-gathered ones around each pass)
        self._registered = {layer: dict(layer.named_parameters(recurse=False)) for layer in layers}
        #: (layer, name) -> the swapped-in parameter whose gradients are watched (:meth:`watch_swapped_parameters`)
        self._watched: dict[tuple[nn.Module, str], torch.Tensor] = {}
        self._uses: list[LayerUse] = []
        #: book-kept parameters that received a gradient other than through their layer's recorded forward
        self._untracked: set[nn.Parameter] = set()
        self._gradients: Optional[tuple[int, dict[nn.Parameter, ParameterGradients]]] = None
        #: the same per privacy unit, with the grouping they were summed by
        self._unit_gradients: Optional[tuple[UnitGrouping, tuple[int, dict[nn.Parameter, ParameterGradients]]]] = None
        self._paused = False
        #: the layers whose per-example gradients come from re-running them alone (decided once, here)
        self._rerun = {layer for layer in layers if _rerun_per_example(layer)}
        self._layer_inputs = check_layer_inputs(module, list(self._rerun))
        #: the served call of each layer with a captured source while it runs (None: a call it does not serve)
        self._captured_calls: dict[nn.Module, Optional[_CapturedCall]] = {}
        self._hooks = []
        self._forwards: list[nn.Module] = []
        for layer in layers:
            rule, source = bookkeeping_rule(layer), captured_source(layer)
            if rule is not None:
                layer.forward = _BookkeptForward(self, layer, rule)
                self._forwards.append(layer)
                self._hooks.extend(p.register_hook(partial(self._check_untracked, p))
                                   for p in layer.parameters(recurse=False) if p.requires_grad)
            elif source is not None:
                self._hooks.extend(self._capture_hooks(layer, source))
            else:
                self._hooks.append(layer.register_forward_hook(self._watch_output, with_kwargs=True))

    def forward(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def records(self, layer: nn.Module) -> bool:
        """Whether a call of ``layer`` is recorded now: in training mode, with autograd on, not paused."""
        return not self._paused and _recording(layer)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Within: the wrapped model runs as if it were not wrapped.  Its layers call their own forward
        and record nothing (their parameters get ordinary autograd gradients), the parameter hooks
        ignore those gradients, and no layer input is checked or broadcast over the batch.  Records of an earlier
        pass are kept as they are."""
        previous = self._paused
        self._paused = self._layer_inputs.paused = True
        try:
            yield
        finally:
            self._paused = self._layer_inputs.paused = previous

    def watch_swapped_parameters(self, layer: nn.Module) -> None:
        """Watch the gradients of the parameters ``layer`` holds in place of its registered ones (FSDP's
        all-gathered parameters during a pass) as :meth:`_check_untracked` watches the registered ones: a
        gradient reaching them outside book-keeping would otherwise escape the check (FSDP turns it into a
        gradient of the shard by assignment, which fires no hook).  FSDP keeps one all-gathered parameter per
        shard for the whole run, so each is hooked once."""
        for name, registered in self._registered[layer].items():
            current = getattr(layer, name)
            if current is not registered and current.requires_grad and self._watched.get((layer, name)) is not current:
                self._watched[layer, name] = current
                self._hooks.append(current.register_hook(partial(self._check_untracked, registered)))

    def _check_untracked(self, p: nn.Parameter, grad: Optional[torch.Tensor]) -> None:
        """A gradient hook of a rule layer's parameter: the rule's calls give it none (None); while
        paused, plain autograd gives it one, which is not the engine's."""
        if grad is not None and not self._paused:
            self._untracked.add(p)

    def record_use(self, layer: nn.Module, rule: Optional[BookkeepingRule], inputs: tuple,
                   keywords: Optional[dict] = None, source: Optional[CapturedSource] = None) -> LayerUse:
        """A new use of ``layer`` on the positional ``inputs`` (and constant ``keywords``), in the current
        forward pass (its output gradient, or its capture point's input gradient, comes later)."""
        use = LayerUse(layer, rule, tuple(x.detach() for x in inputs), self._layer_inputs.forward_passes,
                       _call_batch_size(layer, inputs, {}), keywords, source)
        self._uses.append(use)
        self._gradients = self._unit_gradients = None
        return use

    def _watch_output(self, layer: nn.Module, inputs: tuple, keywords: dict, output: Any) -> None:
        """A recorded layer's call: record its inputs and, later, its output gradient."""
        if not self.records(layer):
            return
        if not isinstance(output, torch.Tensor):
            raise UnsupportedLayerError(
                f"{self._layer_names[layer]} returns {type(output).__name__}, not one tensor: book-keeping cannot "
                f"compute its per-example gradients (grad_sample_mode='hooks' can)")
        if output.requires_grad:
            output.register_hook(self.record_use(layer, None, inputs, keywords).receive)

    def _capture_hooks(self, layer: nn.Module, source: CapturedSource) -> list[RemovableHandle]:
        """The hooks that record a layer with a captured source: a call the source serves records the gradient at
        its capture point's input; any other call is recorded as :meth:`_watch_output` records it, to be re-run
        per example."""
        return [layer.register_forward_pre_hook(partial(self._open_captured_call, source), with_kwargs=True),
                source.capture_point(layer).register_forward_hook(partial(self._capture, layer, source)),
                layer.register_forward_hook(self._close_captured_call, with_kwargs=True)]

    def _open_captured_call(self, source: CapturedSource, layer: nn.Module, args: tuple, kwargs: dict) -> None:
        """The layer's forward pre-hook (after :class:`LayerInputs`'): whether its source serves this call."""
        served = self.records(layer) and source.serves(layer, args, kwargs)
        # always set, so that a call that raised half-way leaves nothing to the next one
        self._captured_calls[layer] = _CapturedCall(args[:1]) if served else None

    def _capture(self, layer: nn.Module, source: CapturedSource, point: nn.Module, inputs: tuple,
                 output: Any) -> None:
        """The capture point's forward hook: in a served call of ``layer``, record the use whose gradient is the
        one at the capture point's input."""
        call = self._captured_calls.get(layer)
        if call is None:  # the capture point ran outside a served call of its layer
            return
        if call.use is not None:
            raise UnsupportedLayerError(
                f"{self._layer_names[layer]}: its {type(point).__name__} ran twice in one call, where book-keeping "
                f"reads its per-example gradients off the one input gradient of that module: this forward is not "
                f"the one its captured source reads")
        call.use = self.record_use(layer, None, call.inputs, source=source)
        if inputs[0].requires_grad:
            inputs[0].register_hook(call.use.receive)

    def _close_captured_call(self, layer: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        """The layer's forward hook: a call its source did not serve is recorded to be re-run per example; a served
        call must have run its capture point."""
        call = self._captured_calls.pop(layer, None)
        if call is None:
            self._watch_output(layer, args, kwargs, output)
        elif call.use is None:
            raise UnsupportedLayerError(
                f"{self._layer_names[layer]}: its forward did not run the module whose input gradient book-keeping "
                f"reads its per-example gradients off: this forward is not the one its captured source reads")

    def _parameter_gradients(self, units: Optional[UnitGrouping] = None
                             ) -> tuple[int, dict[nn.Parameter, ParameterGradients]]:
        """(batch size, per-example gradients of every reached trainable parameter) of this step; ``units``:
        per privacy unit (:meth:`~dpnoise.training.per_example_gradients.ParameterGradients.by_unit`)."""
        if units is not None:
            if self._unit_gradients is None or self._unit_gradients[0] is not units:
                batch, gradients = self._parameter_gradients()
                if batch and batch != len(units.of_example):
                    raise EngineStateError(f"the batch has {batch} examples but its privacy units name "
                                           f"{len(units.of_example)}")
                self._unit_gradients = units, (batch, {p: g.by_unit(units) for p, g in gradients.items()})
            return self._unit_gradients[1]
        if self._gradients is not None:
            return self._gradients
        if self._untracked:
            names = ", ".join(sorted(self._parameter_names[p] for p in self._untracked))
            raise EngineStateError(
                f"parameters {names} received gradients outside book-keeping (a use outside their layer's "
                f"forward, or a forward pass in evaluation mode: call model.train()); their per-example "
                f"gradients would be missing from the clipping")
        reached = [use for use in self._uses if use.backward_passes]
        if any(use.backward_passes > 1 for use in reached) or len({use.forward_pass for use in reached}) > 1:
            raise EngineStateError(
                "per-example clipping needs exactly one forward and backward pass per optimizer step; gradient "
                "accumulation over Poisson batches (several backward passes, or forward passes, before a step) "
                "is not supported")
        if not reached:
            if self._layer_inputs.batch_size == 0:
                return 0, {}
            raise EngineStateError("per-example clipping needs exactly one forward and backward pass per optimizer "
                                   "step; no backward pass reached a trainable layer since the last step")
        sizes = {use.batch_size for use in reached}
        if len(sizes) > 1:
            seen = ", ".join(sorted({f"{type(use.layer).__name__} {use.batch_size}" for use in reached}))
            raise EngineStateError(f"trainable layers saw inputs of different batch sizes ({seen}): book-keeping "
                                   f"needs the batch on dimension 0 of every trainable layer's input")
        batch = sizes.pop()
        contributions: dict[nn.Parameter, list[Contribution]] = {}
        for use in reached if batch else ():
            for p, contribution in self._use_gradients(use).items():
                contributions.setdefault(p, []).append(contribution)
        self._gradients = batch, {p: ParameterGradients(p.shape, parts, self.max_chunk_elements)
                                  for p, parts in contributions.items()}
        return self._gradients

    def _use_gradients(self, use: LayerUse) -> dict[nn.Parameter, Contribution]:
        """Per-example gradients (of the mean loss) of ``use``'s trainable parameters, keyed by the registered
        parameters (those the optimizer steps)."""
        layer, inputs, output_grad = use.layer, use.inputs, use.output_grad
        if use.rule is not None:
            return self._registered_keys(layer, use.rule.gradients(layer, inputs[0], output_grad))
        if use.source is not None:
            samples = use.source.gradients(layer, output_grad)
        elif layer in self._rerun:
            with self.paused():  # the re-run records nothing and checks no input
                gradients = layer_per_example_gradients(layer, inputs[0], use.keywords or {}, output_grad)
            samples = {p: MaterialisedGradients(g.to(compute_dtype(g.dtype))) for p, g in gradients.items()}
        elif type(layer) is nn.EmbeddingBag:
            samples = {layer.weight: embedding_bag_rows(layer, list(inputs), output_grad)}
        else:
            dtype = compute_dtype(output_grad.dtype)
            activations, output_grad = inputs[0].to(dtype), output_grad.to(dtype)
            if type(layer) in WINDOW_GRADIENTS:
                weight, bias = WINDOW_GRADIENTS[type(layer)](layer, activations, output_grad)
                samples = {layer.weight: MaterialisedGradients(weight, CONV_WEIGHT_PERMUTATION),
                           layer.bias: MaterialisedGradients(bias)}
            else:
                samples = {p: MaterialisedGradients(g)
                           for p, g in GRAD_SAMPLERS[type(layer)](layer, [activations], output_grad).items()}
        return {p: g for p, g in samples.items() if p is not None and p.requires_grad}

    def _registered_keys(self, layer: nn.Module,
                         gradients: dict[nn.Parameter, Contribution]) -> dict[nn.Parameter, Contribution]:
        """``gradients`` keyed by ``layer``'s registered parameters: a rule reads ``layer.weight``, which is
        FSDP's all-gathered parameter while the layer is unsharded (e.g. ``reshard_after_backward=False``)."""
        registered = {getattr(layer, name): p for name, p in self._registered[layer].items()}
        return {registered.get(p, p): g for p, g in gradients.items()}

    def per_example_norms(self, norm_ord: int, units: Optional[UnitGrouping] = None) -> torch.Tensor:
        """``(batch,)`` L1 or L2 norm of each example's gradient over all trainable parameters (``units``: the
        ``(units.count,)`` norms of each privacy unit's gradient, the sum of its examples')."""
        _check_norm_ord(norm_ord)
        batch, gradients = self._parameter_gradients(units)
        if not gradients:
            return torch.zeros(batch if units is None else units.count, device=next(self._module.parameters()).device)
        power = sum(g.norm_power(norm_ord) for g in gradients.values())
        return power.pow(1 / norm_ord) * batch  # the per-example loss is batch * (its share of the mean)

    def clipped_sums(self, params: list[nn.Parameter], factors: torch.Tensor,
                     units: Optional[UnitGrouping] = None) -> list[torch.Tensor]:
        """``sum_i factors[i] * grad_i`` for each of ``params`` (``units``: over the units, ``grad_i`` a unit's
        gradient); consumes this step's records."""
        try:
            return self._weighted_sums(params, factors, units)
        finally:
            self.clear()

    def example_gradients(self, params: list[nn.Parameter], examples: Sequence[int]) -> list[torch.Tensor]:
        """``(len(examples), *p.shape)`` gradients ``grad_i`` of the given examples for each of ``params``:
        the per-example gradients the clipping sees (each example's own rows summed, as :meth:`clipped_sums`
        sums the batch's); keeps this step's records."""
        batch, gradients = self._parameter_gradients()
        self._check_layer_parameters(params)
        scale = torch.full((1,), float(batch), device=params[0].device if params else None)
        return [torch.stack([gradients[p].of_examples([i]).clipped_sum(scale) if p in gradients else
                             full_zeros(p) for i in examples]) for p in params]

    def _weighted_sums(self, params: list[nn.Parameter], factors: torch.Tensor,
                       units: Optional[UnitGrouping] = None) -> list[torch.Tensor]:
        """``sum_i factors[i] * grad_i`` for each of ``params``, ``grad_i`` the gradient of example (or unit) i's
        own loss: the recorded gradients are of the batch's mean loss, so they are scaled by the batch size."""
        batch, gradients = self._parameter_gradients(units)
        self._check_layer_parameters(params)
        scaled = factors * batch
        # a shard's clipped sum has the full parameter's shape (the rank's examples' full gradients)
        return [gradients[p].clipped_sum(scaled) if p in gradients else full_zeros(p) for p in params]

    def _check_layer_parameters(self, params: list[nn.Parameter]) -> None:
        """Refuse parameters that belong to no trainable layer of the wrapped model (no per-example gradients)."""
        missing = [tuple(p.shape) for p in params if p not in self._layer_parameters]
        if missing:
            raise EngineStateError(f"no per-example gradients for parameters of shapes {missing}: they belong to no "
                                   f"trainable layer of the wrapped model")

    @property
    def has_records(self) -> bool:
        """Whether a forward pass was recorded since the last :meth:`clear`."""
        return bool(self._uses)

    def clear(self) -> None:
        """Forget recorded passes (called at ``zero_grad`` and after each step's clipped sums)."""
        for use in self._uses:
            use.release()
        self._uses.clear()
        self._untracked.clear()
        self._gradients = self._unit_gradients = None

    def remove_hooks(self) -> None:
        """Detach from the wrapped model (which then trains without recording anything)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for layer in self._forwards:
            del layer.forward
        self._forwards.clear()
        self._layer_inputs.remove()
        self.clear()


def _check_norm_ord(norm_ord: int) -> None:
    if norm_ord not in (1, 2):
        raise InvalidTrainingOptionError(f"norm_ord must be 1 or 2, got {norm_ord}")
