"""A check, on one batch, that the engine's per-example gradients are each example's own.

Every epsilon dpnoise reports assumes that the gradient it clips for example i is the gradient of
example i's loss, computed from example i alone.  The engines cannot see when that is false: a
layer input without a batch dimension that happens to be as long as the batch (nanoGPT's
``wpe(torch.arange(t))``, T5's relative attention bias), a loss that is not the batch mean of
per-example losses (Hugging Face's causal-LM ``outputs.loss``, the mean over the batch's tokens;
``reduction="sum"``), statistics over the batch (BatchNorm, ``x - x.mean(0)``), or a per-example
rule that is wrong.  :func:`verify_per_example_gradients` compares, on one batch:

* exactness: the engine's gradients of a few examples, spread over the batch, with the gradients
  of the same loss on a batch of that one example, by plain autograd through the model (the
  private module's recording paused);
* independence: the same examples' engine gradients once another example of the batch has been
  replaced by a copy of a different one: they must not change;

with dropout off for the duration (:func:`dropout_disabled`), so that every run computes the same
function, and in float64 (:func:`float64_working_copy`): the engine and autograd add up the same
terms in different orders, and a gradient that is zero in exact arithmetic (a key bias of
attention, by the shift invariance of the softmax) comes out of float32 as rounding noise, which no
relative tolerance could compare.  A relative error above ``rtol`` raises
:class:`PerExampleCheckError`, naming the parameter with the largest one.
:func:`check_per_example` runs it on a copy of a model wrapped as ``make_private`` would wrap it.

Cost: two forward and backward passes of the batch and one per checked example, in float64, and
the checked examples' gradients materialised (3 x the parameters, by default): on the CPU, about
4 to 7 training steps of a small CNN or a 2-layer GPT-2 (batch 32).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from dpnoise.accounting.validation import check_count, check_positive
from dpnoise.training.batches import (
    LossFunction,
    batch_loss,
    check_loss_fn,
    is_hugging_face_causal_lm,
    leading_size,
    map_tensors,
    run_model,
)
from dpnoise.training.bookkeeping import BookkeepingModule
from dpnoise.training.errors import (
    EngineStateError,
    InvalidTrainingOptionError,
    PerExampleCheckError,
    UnsupportedLayerError,
)
from dpnoise.training.execution import GradSampleMode
from dpnoise.training.optimizers import flat_grad_sample
from dpnoise.training.provenance import unobserved_passes
from dpnoise.training.wrapping import HooksModule, PrivateModule, wrap_for_per_example_gradients


#: the functions of ``torch.nn.functional`` that drop activations at random (``nn.Dropout`` and its
#: kin, and Hugging Face's eager attention, call them through the module at call time)
DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")

#: the examples of a batch the check runs on (their first ones): enough for any mixing to show, few enough
#: that its passes cost about a training step (benchmarks/README.md)
CHECKED_BATCH = 8

#: one sentence on what makes an example's gradient depend on others, for every failure
LIKELY_CAUSES = (
    "Likely causes: a layer input without a batch dimension (e.g. wpe(torch.arange(t)): expand it over the "
    "batch), a loss that is not the mean of per-example losses over the batch (reduction='sum', or a mean over "
    "the batch's tokens such as Hugging Face's causal-LM outputs.loss: use loss_fn=dpnoise.training.causal_lm_loss), "
    "batch statistics (BatchNorm-like normalisation over the batch), or a layer whose per-example rule is wrong.")


@dataclass(frozen=True)
class Discrepancy:
    """The largest relative error one check found, and where (``parameter``: None when nothing was compared)."""

    error: float
    parameter: Optional[str] = None
    example: Optional[int] = None


@dataclass(frozen=True)
class PerExampleCheckReport:
    """What :func:`verify_per_example_gradients` compared, and the largest errors it found."""

    #: the engine checked: "bookkeeping" or "hooks"
    engine: str
    #: indices of the checked examples in the batch (empty when skipped)
    examples: tuple[int, ...]
    #: engine vs one-example autograd
    exactness: Discrepancy
    #: the engine's gradients before vs after another example was replaced
    independence: Discrepancy
    seconds: float
    #: why nothing was checked (None: checked)
    skipped: Optional[str] = None


# ------------------------------------------------------------------------------------------- public API
def check_per_example(model: nn.Module, loss_fn: Optional[LossFunction], batch: Any, *,
                      grad_sample_mode: GradSampleMode = "auto", examples: int = 3,
                      rtol: float = 1e-5) -> PerExampleCheckReport:
    """Check that ``make_private`` would clip each example's own gradient of ``loss_fn`` on ``batch``.

    A deep copy of ``model`` is wrapped as the engine would (:func:`wrap_for_per_example_gradients`,
    ``grad_sample_mode`` resolved the same way), put in training mode and checked by
    :func:`verify_per_example_gradients`; ``model`` itself is left untouched.  ``loss_fn``: as in
    training (None: the model's ``outputs.loss`` for a dict batch, else cross-entropy).  Raises
    :class:`PerExampleCheckError` when the check fails.
    """
    check_loss_fn(loss_fn)
    private_module, _ = wrap_for_per_example_gradients(copy.deepcopy(model), grad_sample_mode)
    private_module.train()
    return verify_per_example_gradients(private_module, batch, loss_fn=loss_fn, examples=examples, rtol=rtol)


def verify_per_example_gradients(private_module: PrivateModule, batch: Any, *,
                                 loss_fn: Optional[LossFunction] = None, examples: int = 3, rtol: float = 1e-5,
                                 atol: float = 1e-10, batch_limit: Optional[int] = CHECKED_BATCH
                                 ) -> PerExampleCheckReport:
    """Compare the engine's per-example gradients of ``batch`` with each example's own (module docstring).

    ``private_module``: the :class:`BookkeepingModule` or :class:`HooksModule` wrapping the model,
    between optimizer steps (no pass recorded).  The model's parameters and buffers are replaced by
    float64 copies for the duration (the batch's floating tensors too): afterwards they, and their
    ``grad``, are the very tensors they were, nothing is recorded, and the next step sees only its own
    batch's forward pass (:func:`~dpnoise.training.provenance.unobserved_passes`).  ``examples``
    examples are checked (at most all but one of the batch, which is the one replaced).  The error
    of a parameter is ``||engine - expected|| / max(||expected||, atol)``, for each checked example.
    A batch of fewer than 2 examples is not checked (the report says so).  Raises
    :class:`PerExampleCheckError` when an error exceeds ``rtol``.

    ``batch_limit``: the check runs on the batch's first ``batch_limit`` examples (None: all), which
    bounds its cost: examples mix in a batch of any size, and a layer input whose length equals the
    training batch's size no longer does in the smaller batch (the layer-input checks then refuse it).
    """
    start = time.perf_counter()
    examples = check_count("examples", examples, 1)
    rtol, atol = check_positive("rtol", rtol), check_positive("atol", atol)
    engine_name = engine_kind(private_module)
    model = wrapped_model(private_module)
    trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    batch_size = leading_size(batch) or 0
    if batch_size < 2 or not trained:
        reason = f"a batch of {batch_size} example(s)" if trained else "no trainable parameter"
        return PerExampleCheckReport(engine_name, (), Discrepancy(0.0), Discrepancy(0.0), time.perf_counter() - start,
                                     skipped=f"{reason}: nothing to compare")
    names, params = zip(*trained)
    if batch_limit is not None and batch_size > batch_limit:
        batch, batch_size = examples_batch(batch, slice(0, batch_limit)), check_count("batch_limit", batch_limit, 2)
    checked = spread_examples(batch_size, examples)
    replaced = next(i for i in range(batch_size) if i not in checked)
    source = checked[0]
    with dropout_disabled(), float64_working_copy(model), unobserved_passes():
        batch = floating_tensors_in_float64(batch)
        engine = engine_example_gradients(private_module, batch, loss_fn, params, checked)
        with private_module.paused():
            expected = per_parameter([single_example_gradients(model, example_batch(batch, i), loss_fn, params)
                                      for i in checked])
        after_replacement = engine_example_gradients(
            private_module, batch_with_example_replaced(batch, replaced, source), loss_fn, params, checked)
    exactness = largest_relative_error(engine, expected, names, checked, atol)
    independence = largest_relative_error(after_replacement, engine, names, checked, atol)
    if exactness.error > rtol:
        raise PerExampleCheckError(failure_message(
            "exactness vs. one-example autograd", exactness, rtol, model,
            summed_loss_hint(engine, expected, batch_size)))
    if independence.error > rtol:
        raise PerExampleCheckError(failure_message(
            f"independence when example {replaced} was replaced by a copy of example {source}", independence, rtol,
            model))
    return PerExampleCheckReport(engine_name, tuple(checked), exactness, independence, time.perf_counter() - start)


def refuse_token_mean_lm_loss(model: nn.Module, loss_fn: Optional[LossFunction]) -> None:
    """Refuse a Hugging Face causal language model trained on its own ``outputs.loss`` (``loss_fn`` None).

    That loss is the mean over all the real tokens of the batch, so that each example's gradient
    depends on the other examples' lengths (:mod:`dpnoise.training.losses`).  The model may be
    wrapped by peft.  transformers is never imported here: a Hugging Face model has imported it.
    """
    if loss_fn is not None or not is_hugging_face_causal_lm(model):
        return
    raise PerExampleCheckError(
        f"{type(model).__name__}'s own loss (outputs.loss) is the mean over the batch's tokens, which makes each "
        f"example's gradient depend on the other examples' lengths and the reported epsilon wrong: pass "
        f"loss_fn=dpnoise.training.causal_lm_loss (the mean over each sequence's tokens, then over the batch)")


# ------------------------------------------------------------------------------------------- randomness
@contextmanager
def dropout_disabled() -> Iterator[None]:
    """Within: the dropout functions of ``torch.nn.functional`` (:data:`DROPOUT_FUNCTIONS`) return their
    input, and ``scaled_dot_product_attention`` runs with ``dropout_p=0``.

    ``nn.Dropout`` and its kin, Hugging Face's eager attention (``nn.functional.dropout``) and its
    SDPA attention (``torch.nn.functional.scaled_dot_product_attention``) look these up at call
    time, so the patch reaches them: every forward pass computes the same function of its input.
    """
    originals = {name: getattr(F, name) for name in (*DROPOUT_FUNCTIONS, "scaled_dot_product_attention")}
    attention = originals["scaled_dot_product_attention"]
    try:
        for name in DROPOUT_FUNCTIONS:
            setattr(F, name, _no_dropout)
        F.scaled_dot_product_attention = partial(_attention_without_dropout, attention)
        yield
    finally:
        for name, function in originals.items():
            setattr(F, name, function)


def _no_dropout(inputs: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A dropout function that drops nothing: its input."""
    return inputs


def _attention_without_dropout(attention: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, *args: Any,
                               **kwargs: Any) -> torch.Tensor:
    """``attention`` (PyTorch's scaled dot-product attention) with ``dropout_p=0``."""
    return attention(query, key, value, attn_mask, 0.0, *args, **kwargs)


@contextmanager
def float64_working_copy(model: nn.Module) -> Iterator[None]:
    """Within: ``model``'s parameters and buffers hold float64 copies of their values (copies of the
    others' values, e.g. counters), and its parameters no ``grad``; after: the original tensors and
    ``grad`` again (the same objects, untouched by whatever ran within, e.g. running statistics).
    The parameters and buffers stay the same objects (their ``.data`` is swapped): hooks, optimizers
    and the private module keep referring to them."""
    tensors = [*model.parameters(), *model.buffers()]
    originals = [(tensor, tensor.data, tensor.grad) for tensor in tensors]
    try:
        for tensor in tensors:
            tensor.grad = None
            tensor.data = tensor.data.to(torch.float64) if tensor.is_floating_point() else tensor.data.clone()
        yield
    finally:
        for tensor, data, grad in originals:
            tensor.data = data
            tensor.grad = grad


def floating_tensors_in_float64(batch: Any) -> Any:
    """``batch`` with its floating-point tensors (inputs, pixel values) in float64, the others as they are."""
    return map_tensors(batch, lambda t: t.to(torch.float64) if t.is_floating_point() else t)


# ------------------------------------------------------------------------------------------- the engine's side
def engine_kind(private_module: PrivateModule) -> str:
    """``"bookkeeping"`` for a :class:`BookkeepingModule`, ``"hooks"`` for a :class:`HooksModule`."""
    if isinstance(private_module, BookkeepingModule):
        return "bookkeeping"
    if isinstance(private_module, HooksModule):
        return "hooks"
    raise InvalidTrainingOptionError(f"the per-example check needs the private module make_private returns (a "
                                     f"BookkeepingModule or HooksModule), got {type(private_module).__name__}")


def wrapped_model(private_module: PrivateModule) -> nn.Module:
    """The model a :class:`BookkeepingModule` or :class:`HooksModule` wraps."""
    engine_kind(private_module)
    return private_module._module


def engine_example_gradients(private_module: PrivateModule, batch: Any, loss_fn: Optional[LossFunction],
                             params: tuple[nn.Parameter, ...], examples: list[int]) -> list[torch.Tensor]:
    """``(len(examples), *p.shape)`` per parameter: the per-example gradients the engine would clip.

    One forward and backward pass of the batch's training loss (:func:`batch_loss`) through
    ``private_module``; the records, ``grad`` and ``grad_sample`` of the pass are cleared after.  A
    layer the engine refuses during the pass (:class:`UnsupportedLayerError`) refuses the check.
    Both engines' gradients are of each example's own loss (the batch mean's, times the batch size).
    """
    _start_without_records(private_module, params)
    try:
        try:
            batch_loss(run_model(private_module, batch), batch, loss_fn).backward()
        except UnsupportedLayerError as err:
            raise PerExampleCheckError(f"the engine refuses this model: {err}") from err
        return _recorded_example_gradients(private_module, params, examples, leading_size(batch))
    finally:
        _clear_records(private_module, params)


def _start_without_records(private_module: PrivateModule, params: tuple[nn.Parameter, ...]) -> None:
    """Refuse a recorded pass that no optimizer step has consumed yet; forget the per-example gradients a
    step has consumed (Opacus's, marked processed, which ``zero_grad`` would drop)."""
    if isinstance(private_module, BookkeepingModule):
        pending = private_module.has_records
    else:
        pending = any(not _consumed(p.grad_sample) for p in params if getattr(p, "grad_sample", None) is not None)
    if pending:
        raise EngineStateError("the per-example check runs between optimizer steps: a pass is recorded and not "
                               "consumed yet (call it before the forward pass, or after optimizer.step())")
    for p in params:
        p.grad_sample = None


def _consumed(grad_sample: Any) -> bool:
    """Whether Opacus's per-example gradients (a tensor or a list) were used by an optimizer step."""
    parts = grad_sample if isinstance(grad_sample, list) else [grad_sample]
    return all(hasattr(part, "_processed") for part in parts)


def _recorded_example_gradients(private_module: PrivateModule, params: tuple[nn.Parameter, ...],
                                examples: list[int], batch_size: int) -> list[torch.Tensor]:
    """The recorded pass's gradients of ``examples``; an engine that cannot give them per example is refused."""
    if isinstance(private_module, BookkeepingModule):
        try:
            return private_module.example_gradients(list(params), examples)
        except EngineStateError as err:
            raise PerExampleCheckError(f"book-keeping cannot give per-example gradients of this batch: {err}. "
                                       f"{LIKELY_CAUSES}") from err
    gradients = []
    for p in params:
        if getattr(p, "grad_sample", None) is None:  # not reached by the loss
            gradients.append(torch.zeros(len(examples), *p.shape, dtype=p.dtype, device=p.device))
            continue
        samples = flat_grad_sample(p)
        if len(samples) != batch_size:
            model = wrapped_model(private_module)
            name = next(name for name, q in model.named_parameters() if q is p)
            raise PerExampleCheckError(f"Opacus's hooks gave parameter {describe_parameter(model, name)} "
                                       f"{len(samples)} per-example gradients for a batch of {batch_size} examples. "
                                       f"{LIKELY_CAUSES}")
        gradients.append(samples[examples])
    return gradients


def _clear_records(private_module: PrivateModule, params: tuple[nn.Parameter, ...]) -> None:
    """Forget a pass: book-keeping's records, Opacus's ``grad_sample`` and autograd's ``grad``."""
    if isinstance(private_module, BookkeepingModule):
        private_module.clear()
    for p in params:
        p.grad_sample = None
        p.grad = None


# ------------------------------------------------------------------------------------------- the reference
def single_example_gradients(model: nn.Module, example: Any, loss_fn: Optional[LossFunction],
                             params: tuple[nn.Parameter, ...]) -> list[torch.Tensor]:
    """The gradient of the training loss of ``example`` (a batch of one) per parameter, by plain autograd
    (zeros where the loss does not reach a parameter).  A model that cannot compute one example alone
    (it ran on the whole batch) is refused: its outputs depend on the batch."""
    try:
        loss = batch_loss(run_model(model, example), example, loss_fn)
    except Exception as err:  # noqa: BLE001  (whatever stops it, the check cannot vouch for the model)
        raise PerExampleCheckError(
            f"per-example gradient check failed (exactness vs. one-example autograd): the model runs on the batch "
            f"but not on one example alone ({type(err).__name__}: {err}), so its outputs depend on the batch. "
            f"{LIKELY_CAUSES}") from err
    gradients = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, gradients)]


def per_parameter(per_example: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Per-example lists of the parameters' gradients as ``(examples, *shape)`` per parameter."""
    return [torch.stack(rows) for rows in zip(*per_example)]


def spread_examples(batch_size: int, examples: int) -> list[int]:
    """``min(examples, batch_size - 1)`` distinct indices spread over the batch, from 0 up (one example is
    always left unchecked, to be replaced)."""
    count = max(1, min(examples, batch_size - 1))
    if count == 1:
        return [0]
    return sorted({round(j * (batch_size - 1) / (count - 1)) for j in range(count)})


def example_batch(batch: Any, index: int) -> Any:
    """``batch`` restricted to example ``index``: every tensor of it (pairs, dicts, nested) whose leading
    dimension is the batch size, labels included, sliced to ``[index : index + 1]``."""
    return examples_batch(batch, slice(index, index + 1))


def examples_batch(batch: Any, examples: slice) -> Any:
    """``batch`` restricted to the ``examples`` (a slice of its examples), as :func:`example_batch`."""
    batch_size = leading_size(batch)
    return map_tensors(batch, lambda t: t[examples] if _is_per_example(t, batch_size) else t)


def batch_with_example_replaced(batch: Any, replaced: int, source: int) -> Any:
    """A copy of ``batch`` whose example ``replaced`` is a copy of example ``source``."""
    def replace(tensor: torch.Tensor) -> torch.Tensor:
        if not _is_per_example(tensor, batch_size):
            return tensor
        changed = tensor.clone()
        changed[replaced] = tensor[source]
        return changed

    batch_size = leading_size(batch)
    return map_tensors(batch, replace)


def _is_per_example(tensor: torch.Tensor, batch_size: int) -> bool:
    """Whether ``tensor`` holds one row per example of a batch of ``batch_size``."""
    return tensor.dim() > 0 and len(tensor) == batch_size


# ------------------------------------------------------------------------------------------- the verdict
def largest_relative_error(found: list[torch.Tensor], expected: list[torch.Tensor], names: tuple[str, ...],
                           examples: list[int], atol: float) -> Discrepancy:
    """The largest ``||found - expected|| / max(||expected||, atol)`` over the parameters (``names``) and the
    checked ``examples``; ``found`` and ``expected``: ``(examples, *shape)`` per parameter."""
    worst_per_parameter = []
    for name, found_rows, expected_rows in zip(names, found, expected):
        # reshape, not flatten(1): a scalar parameter (a learned gate) has rows of shape (examples,)
        difference = (found_rows.double() - expected_rows.double()).reshape(len(examples), -1).norm(dim=1)
        errors = difference / expected_rows.double().reshape(len(examples), -1).norm(dim=1).clamp(min=atol)
        worst = int(errors.argmax())
        worst_per_parameter.append(Discrepancy(float(errors[worst]), name, examples[worst]))
    return max(worst_per_parameter, key=lambda discrepancy: discrepancy.error, default=Discrepancy(0.0))


def summed_loss_hint(engine: list[torch.Tensor], expected: list[torch.Tensor], batch_size: int) -> str:
    """A sentence when the engine's gradients are ``batch_size`` times the examples' own (a loss summed over
    the batch), else an empty one (per parameter ``(examples, *shape)`` both)."""
    found = torch.cat([g.double().flatten() for g in engine])
    reference = torch.cat([g.double().flatten() for g in expected])
    scale = float(found @ reference / (reference @ reference).clamp(min=torch.finfo(torch.float64).tiny))
    proportional = (found - scale * reference).norm() <= 1e-3 * found.norm()
    if not proportional or abs(scale - batch_size) > 1e-3 * batch_size:
        return ""
    return (f" The engine's per-example gradients are {batch_size} (the batch size) times the examples' own: the "
            f"loss is summed over the batch; it must be the batch mean (e.g. reduction='mean').")


def failure_message(check: str, discrepancy: Discrepancy, rtol: float, model: nn.Module, hint: str = "") -> str:
    """One paragraph: which check failed, where, by how much, and why it likely did."""
    return (f"per-example gradient check failed ({check}): parameter "
            f"{describe_parameter(model, discrepancy.parameter)} of example {discrepancy.example} has a relative "
            f"error of {discrepancy.error:.3g} (tolerance {rtol:g}); the epsilon reported would not hold.{hint} "
            f"{LIKELY_CAUSES}")


def describe_parameter(model: nn.Module, name: str) -> str:
    """``"<name> (<type of the layer that holds it>)"``."""
    return f"{name} ({type(model.get_submodule(name.rpartition('.')[0])).__name__})"
