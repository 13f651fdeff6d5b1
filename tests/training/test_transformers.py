"""Hugging Face models as they come through make_private and the training loop: dict batches (physical
and empty ones too), the model's own loss, eval mode and label-less batches refused, LoRA adapters.

Tiny randomly initialised BERT and GPT-2 configurations: no weights are loaded."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from dpnoise import make_private
from dpnoise.data import TokenizedText
from dpnoise.models import count_trainable_parameters
from dpnoise.training.provenance import DrawnBatch
from dpnoise.training import InvalidTrainingOptionError, endless_batches, evaluate_accuracy, train_step, train_steps

transformers = pytest.importorskip("transformers")

VOCAB, LENGTH, EXAMPLES = 40, 8, 24


def tiny_bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(config)


def tiny_gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=16, num_labels=2,
                                     pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return transformers.GPT2ForSequenceClassification(config)


def sentences(with_token_types: bool = True) -> TokenizedText:
    """Padded token ids of random lengths, their masks and labels, as a tokenizer gives them (the models'
    position ids are their own buffer of batch size 1, broadcast over the batch)."""
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, LENGTH + 1, (EXAMPLES,), generator=generator)
    mask = (torch.arange(LENGTH) < lengths[:, None]).long()
    encoded = {"input_ids": torch.randint(2, VOCAB, (EXAMPLES, LENGTH), generator=generator) * mask,
               "attention_mask": mask}
    if with_token_types:
        encoded["token_type_ids"] = torch.zeros_like(mask)
    return TokenizedText(encoded, torch.randint(0, 2, (EXAMPLES,), generator=generator))


def private(model, data=None, **options):
    data = sentences() if data is None else data
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # noise_seed's reproducibility warning
        return make_private(model, optimizer, DataLoader(data, batch_size=6, collate_fn=TokenizedText.collate),
                            **{"mechanism": "gaussian", "noise_multiplier": 0.3, "delta": 1e-5, "noise_seed": 0,
                               **options})


@pytest.mark.parametrize("grad_sample_mode", ["auto", "hooks"])
def test_tiny_bert_trains_on_dict_batches_with_its_own_loss(grad_sample_mode):
    model = tiny_bert()
    before = [p.detach().clone() for p in model.parameters()]
    module, optimizer, loader = private(model, grad_sample_mode=grad_sample_mode)
    history = train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 3)
    assert [m.step for m in history] == [1, 2, 3] and all(0 < m.loss < 5 for m in history)
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    accuracy = evaluate_accuracy(module, DataLoader(sentences(), batch_size=10, collate_fn=TokenizedText.collate))
    assert 0.0 <= accuracy <= 1.0


def test_tiny_gpt2_trains_on_dict_batches():
    module, optimizer, loader = private(tiny_gpt2(), sentences(with_token_types=False))
    history = train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 2)
    assert len(history) == 2 and optimizer.privacy_engine.steps == 2


def test_physical_pieces_of_a_dict_batch_give_the_step_of_the_whole_batch():
    """The same Poisson batch and noise (same noise seed), taken whole or one example at a time: the
    same update (no dropout in the tiny model)."""
    results = []
    for pieces in (None, 1):
        model = tiny_bert()
        module, optimizer, loader = private(model, max_physical_batch_size=pieces)
        steps = train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 1)
        results.append((steps[0].batch_size, [p.detach().clone() for p in model.parameters()]))
    (size, whole), (size_in_pieces, pieces) = results
    assert size == size_in_pieces >= 2
    for a, b in zip(whole, pieces):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_an_empty_dict_batch_takes_a_noise_only_step_without_a_forward_pass():
    model = tiny_bert()
    module, optimizer, loader = private(model)
    empty = loader.collate_fn([])
    assert set(empty) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert all(len(values) == 0 for values in empty.values())
    engine = optimizer.privacy_engine
    engine.batch_provenance.register(empty, DrawnBatch([], draw=0, piece=0, pieces=1))  # as the loader does
    before = [p.detach().clone() for p in model.parameters()]
    called = []
    hook = model.register_forward_pre_hook(lambda *_: called.append(1))
    assert train_step(module, optimizer, empty) == (0.0, 0.0, 0)
    hook.remove()
    assert not called and engine.steps == 1
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))  # the noise moved them


def test_a_model_in_eval_mode_is_refused_naming_model_train():
    model = tiny_bert().eval()  # as from_pretrained returns it
    with pytest.raises(InvalidTrainingOptionError, match=r"eval mode .*model\.train\(\)"):
        private(model)


def test_dict_batches_without_labels_are_refused_before_any_step():
    data = [{("label" if key == "labels" else key): value for key, value in item.items()} for item in sentences()]
    with pytest.raises(InvalidTrainingOptionError, match="labels.*rename 'label' to 'labels'"):
        private(tiny_bert(), data)


def changed(data: TokenizedText, **tensors: torch.Tensor) -> TokenizedText:
    """``data`` with the tensors under some keys replaced (``labels`` too)."""
    merged = {**data.tensors, **tensors}
    return TokenizedText({key: value for key, value in merged.items() if key != "labels"}, merged["labels"])


def tiny_gpt2_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=16,
                                     pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return transformers.GPT2LMHeadModel(config)


def lm_sentences() -> TokenizedText:
    """Token ids whose labels are the ids themselves, -100 on the padding (as Hugging Face's collators give them)."""
    data = sentences(with_token_types=False)
    ids, mask = data.tensors["input_ids"], data.tensors["attention_mask"]
    return changed(data, labels=ids.masked_fill(mask == 0, -100))


BERT_DATA = sentences()
IDS, LABELS = BERT_DATA.tensors["input_ids"], BERT_DATA.tensors["labels"]


@pytest.mark.parametrize("data,message", [
    (changed(BERT_DATA, labels=LABELS.float()),
     r"'labels' must hold integer class indices in \[0, 2\) \(config.num_labels of BertForSequenceClassification, "
     r"or -100: ignored\) for the model's loss, got torch.float32"),
    (changed(BERT_DATA, labels=LABELS + 2), r"'labels' must be in \[0, 2\) .*, got [23]"),
    (changed(BERT_DATA, labels=LABELS - 2), r"'labels' must be in \[0, 2\) .*, got -[12]"),
    (changed(BERT_DATA, input_ids=IDS.float()), "'input_ids' must hold integer indices .*, got torch.float32"),
    (changed(BERT_DATA, input_ids=IDS + VOCAB),
     r"'input_ids' must be in \[0, 40\) \(the input embeddings of BertForSequenceClassification\)"),
    (changed(BERT_DATA, token_type_ids=BERT_DATA.tensors["token_type_ids"].float()), "'token_type_ids' must hold integer"),
], ids=["float labels", "labels above", "labels below", "float ids", "ids above the vocabulary", "float token types"])
def test_dict_batches_with_ids_or_labels_the_model_cannot_take_are_refused_by_make_private(data, message):
    with pytest.raises(InvalidTrainingOptionError, match="dict batches: " + message):
        private(tiny_bert(), data)


def test_a_later_example_out_of_range_is_refused_before_the_model_sees_its_batch():
    """make_private checks the first example; every batch the private loader yields is checked too."""
    model = tiny_bert()
    before = [p.detach().clone() for p in model.parameters()]
    labels = LABELS.clone()
    labels[1:] = 2  # the first example passes
    module, optimizer, loader = private(model, changed(BERT_DATA, labels=labels))
    with pytest.raises(InvalidTrainingOptionError, match=r"'labels' must be in \[0, 2\) .*, got 2"):
        train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 1)
    assert optimizer.privacy_engine.steps == 0 and all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_language_model_labels_are_token_ids_or_ignored():
    from dpnoise.training import causal_lm_loss

    data = lm_sentences()
    module, optimizer, loader = private(tiny_gpt2_lm(), data, loss_fn=causal_lm_loss)  # -100 on the padding
    train_steps(module, optimizer, endless_batches(loader), optimizer.privacy_engine, 1, loss_fn=causal_lm_loss)
    with pytest.raises(InvalidTrainingOptionError,
                       match=r"'labels' must be in \[0, 40\) \(the output layer of GPT2LMHeadModel, or -100: ignored\)"):
        private(tiny_gpt2_lm(), changed(data, labels=data.tensors["labels"] + VOCAB), loss_fn=causal_lm_loss)


def test_multi_label_float_targets_of_a_classifier_pass():
    """Float labels of shape (batch, num_labels): Hugging Face infers a multi-label loss from them."""
    targets = torch.nn.functional.one_hot(LABELS, 2).float()
    module, optimizer, loader = private(tiny_bert(), changed(BERT_DATA, labels=targets))
    assert next(iter(loader))["labels"].dtype == torch.float32


@pytest.mark.parametrize("mechanism,noise", [("dirichlet", {"noise_multiplier": None, "concentration": 0.5}),
                                             ("penultimate-gaussian", {})])
def test_output_mechanisms_refuse_dict_batches(mechanism, noise):
    """They perturb the logits a model returns: a Hugging Face model given the labels computes its loss
    from the unperturbed ones."""
    with pytest.raises(InvalidTrainingOptionError, match="gradient mechanisms only"):
        private(tiny_bert(), mechanism=mechanism, **noise)


def test_lora_adapters_train_privately_and_lap2_counts_only_them():
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=2, lora_alpha=4, target_modules=["query", "value"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = peft.get_peft_model(tiny_bert(), config)
    adapters = {name: p for name, p in model.named_parameters() if "lora_" in name}
    head = {name: p for name, p in model.named_parameters() if "modules_to_save" in name}
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    assert adapters and head and frozen
    module, optimizer, loader = private(model, mechanism="lap2", noise_multiplier=None, laplace_scale=0.5)
    engine = optimizer.privacy_engine
    expected = sum(p.numel() for p in (*adapters.values(), *head.values()))
    assert engine.setup.params == count_trainable_parameters(model) == expected
    assert expected < sum(p.numel() for p in model.parameters()) / 3
    assert engine.step_event.event.num_params == expected
    before = {name: p.detach().clone() for name, p in adapters.items()}
    train_steps(module, optimizer, endless_batches(loader), engine, 2)
    assert any(not torch.equal(before[name], p) for name, p in adapters.items())
    assert all(torch.equal(frozen[name], p) for name, p in model.named_parameters() if name in frozen)


def test_bfloat16_weights_train_privately_with_float32_norms_close_to_float32s():
    """A model in bfloat16: one private step; its clipped sum within 5% of the float32 model's (the
    measured error on MiniLM-L6 is in docs/TRAINING.md, "Mixed precision")."""
    from dpnoise.mechanisms.clipping import clip_factors
    from dpnoise.training.bookkeeping import BookkeepingModule

    batch = TokenizedText.collate([sentences()[i] for i in range(6)])
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_bert().to(dtype)
        wrapped = BookkeepingModule(model)
        wrapped(**batch).loss.backward()
        norms = wrapped.per_example_norms(2)
        assert norms.dtype == torch.float32
        results[dtype] = [s.float() for s in wrapped.clipped_sums(list(model.parameters()), clip_factors(norms, 0.1))]
    error = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(results[torch.bfloat16], results[torch.float32])))
    assert error / torch.sqrt(sum((b ** 2).sum() for b in results[torch.float32])) < 0.05
    module, optimizer, loader = private(tiny_bert().to(torch.bfloat16))
    for batch_ in loader:
        optimizer.zero_grad()
        module(**batch_).loss.backward()
        optimizer.step()
        break
    assert optimizer.privacy_engine.steps == 1 and all(p.dtype == torch.bfloat16 for p in module.parameters())


@pytest.mark.parametrize("grad_sample_mode", ["bookkeeping", "hooks"])
def test_the_private_module_is_used_as_the_model_is(grad_sample_mode, tmp_path):
    """save_pretrained, config, get_input_embeddings and generate-like calls reach the wrapped model; unwrap()
    is the model itself (peft's merge_and_unload through it)."""
    model = tiny_bert()
    module, optimizer, loader = private(model, grad_sample_mode=grad_sample_mode)
    assert module.unwrap() is model and module.config is model.config
    assert module.get_input_embeddings() is model.get_input_embeddings()
    module.save_pretrained(tmp_path / "saved")
    reloaded = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "saved")
    assert torch.equal(reloaded.classifier.weight, model.classifier.weight)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        module.no_such_attribute


def test_a_peft_model_is_merged_through_unwrap():
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=2, lora_alpha=4, target_modules=["query", "value"])
    module, optimizer, loader = private(peft.get_peft_model(tiny_bert(), config))
    merged = module.unwrap().merge_and_unload()
    assert isinstance(merged, transformers.BertForSequenceClassification)
