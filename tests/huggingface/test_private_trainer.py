"""The private Trainer: Trainer's loop with dpnoise's steps (tiny random BERT and GPT-2 configurations)."""

import json
import warnings

import pytest
import torch
from torch.utils.data import Dataset

transformers = pytest.importorskip("transformers")

from dpnoise.huggingface import CHECKPOINT_NAME, PrivateTrainer  # noqa: E402
from dpnoise.training import CheckpointMismatchError, InvalidTrainingOptionError, PrivacyOptions  # noqa: E402

VOCAB, LENGTH, EXAMPLES = 40, 8, 64


class Sentences(Dataset):
    """Padded token ids, masks and labels, one dict per example (what a tokenized dataset gives)."""

    def __init__(self, examples: int = EXAMPLES, seed: int = 1, causal: bool = False):
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(2, LENGTH + 1, (examples,), generator=generator)
        self.mask = (torch.arange(LENGTH) < lengths[:, None]).long()
        self.ids = torch.randint(2, VOCAB, (examples, LENGTH), generator=generator) * self.mask
        self.labels = (self.ids.masked_fill(self.mask == 0, -100) if causal
                       else (self.ids[:, 0] % 2))  # a learnable rule: the first token's parity

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(config)


def tiny_gpt2_lm():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def arguments(tmp_path, **overrides):
    return transformers.TrainingArguments(**{
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 16, "num_train_epochs": 2,
        "learning_rate": 0.05, "logging_steps": 1, "save_strategy": "no", "report_to": [], "use_cpu": True, "seed": 0,
        "disable_tqdm": True, **overrides})


def trainer(tmp_path, model=None, privacy=None, args=None, **options):
    privacy = privacy or {"mechanism": "gaussian", "delta": 1e-5, "target_epsilon": 4.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PrivateTrainer(model or tiny_bert(), args or arguments(tmp_path), privacy=privacy,
                              train_dataset=Sentences(), eval_dataset=Sentences(32, seed=2), noise_seed=0, **options)


def quietly(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


def test_training_takes_private_steps_and_logs_epsilon(tmp_path):
    private = trainer(tmp_path)
    output = quietly(private.train)
    engine = private.privacy_engine
    # q = 16 / 64: 4 Poisson batches per epoch, 2 epochs, each one accounted step and one Trainer step
    assert engine.setup.sample_rate == 0.25 and engine.steps == private.state.global_step == 8
    assert engine.get_epsilon() <= 4.0 and output.global_step == 8
    logged = [entry for entry in private.state.log_history if "learning_rate" in entry]  # one per step
    assert len(logged) == 8 and [entry["private_steps"] for entry in logged] == list(range(1, 9))
    assert logged[-1]["epsilon"] == engine.get_epsilon() and all(entry["delta"] == 1e-5 for entry in logged)
    assert [entry["epsilon"] for entry in logged] == sorted(entry["epsilon"] for entry in logged)
    # nothing computed from the private batches without noise: no loss, no gradient norm
    assert not any(name in entry for entry in private.state.log_history for name in ("loss", "train_loss", "grad_norm"))
    metrics = quietly(private.evaluate)
    assert "eval_loss" in metrics and "epsilon" in private.state.log_history[-1]


def test_the_training_loss_is_logged_only_when_asked_and_warned(tmp_path):
    with pytest.warns(UserWarning, match="not covered by the epsilon"):
        private = PrivateTrainer(tiny_bert(), arguments(tmp_path, max_steps=2), train_dataset=Sentences(), seed=0,
                                 privacy={"mechanism": "gaussian", "delta": 1e-5, "noise": 1.0},
                                 log_private_batch_stats=True)
    quietly(private.train)
    assert sum("loss" in entry for entry in private.state.log_history) == 2


def test_physical_batches_are_one_step_and_the_update_is_the_clipped_noisy_sum(tmp_path):
    """gradient_accumulation_steps=4 at 4 examples a piece: one accounted step per Poisson batch of about 16."""
    args = arguments(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=4, max_steps=3)
    private = trainer(tmp_path, args=args)
    quietly(private.train)
    engine = private.privacy_engine
    assert engine.setup.sample_rate == 0.25 and engine.steps == 3 == private.state.global_step
    assert private.args.gradient_accumulation_steps == 1
    whole = trainer(tmp_path, args=arguments(tmp_path, max_steps=3))  # the same draws and noise in one piece each
    quietly(whole.train)
    for mine, reference in zip(private.model.parameters(), whole.model.parameters()):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)


def test_the_budget_stops_training_through_trainers_control_flow(tmp_path):
    privacy = {"mechanism": "gaussian", "delta": 1e-5, "noise": 2.0, "target_epsilon": 3.0}
    private = trainer(tmp_path, privacy=privacy, args=arguments(tmp_path, num_train_epochs=50))
    quietly(private.train)
    engine = private.privacy_engine
    assert engine.budget_exhausted and engine.steps == engine.max_steps < 200
    assert engine.get_epsilon() <= 3.0 and private.state.global_step <= engine.steps + 1


def test_causal_language_models_use_the_per_sequence_loss(tmp_path):
    privacy = {"mechanism": "lap2", "delta": 1e-5, "target_epsilon": 8.0}
    private = quietly(lambda: PrivateTrainer(tiny_gpt2_lm(), arguments(tmp_path, max_steps=2), privacy=privacy,
                                             train_dataset=Sentences(causal=True), noise_seed=0))
    quietly(private.train)
    assert private.privacy_engine.steps == 2
    assert private.privacy_engine.per_example_report.exactness.error < 1e-5  # the first step's check passed


def test_trainers_own_clipping_and_fp16_are_refused(tmp_path):
    with pytest.raises(InvalidTrainingOptionError, match="max_grad_norm=0.5 would clip the noisy average"):
        trainer(tmp_path, args=arguments(tmp_path, max_grad_norm=0.5))


def test_checkpoints_hold_the_ledger_and_a_resume_restores_it(tmp_path):
    args = arguments(tmp_path, save_strategy="steps", save_steps=3, max_steps=6)
    first = trainer(tmp_path, args=args)
    quietly(first.train)
    checkpoint = tmp_path / "out" / "checkpoint-3"
    assert (checkpoint / CHECKPOINT_NAME).is_file() and (checkpoint / "trainer_state.json").is_file()
    resumed = trainer(tmp_path, args=args)
    quietly(lambda: resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-6")))
    assert resumed.privacy_engine.steps == 6 and resumed.privacy_engine.get_epsilon() == first.privacy_engine.get_epsilon()
    older = trainer(tmp_path, args=args)
    with pytest.raises(CheckpointMismatchError, match="older than its run's latest checkpoint"):
        quietly(lambda: older.train(resume_from_checkpoint=str(checkpoint)))
    other = trainer(tmp_path, privacy=PrivacyOptions(mechanism="gaussian", delta=1e-5, target_epsilon=2.0, epochs=1.5),
                    args=args)
    with pytest.raises(CheckpointMismatchError, match="differs from this run"):
        quietly(lambda: other.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-6")))


def test_the_saved_model_and_card_state_the_guarantee(tmp_path):
    private = trainer(tmp_path, args=arguments(tmp_path, max_steps=2))
    quietly(private.train)
    private.save_model()
    quietly(private.create_model_card)
    out = tmp_path / "out"
    assert (out / "config.json").is_file()
    reloaded = transformers.BertForSequenceClassification.from_pretrained(out)
    assert torch.equal(reloaded.classifier.weight, private.model.classifier.weight)
    card = (out / "README.md").read_text()
    assert "## Differential privacy" in card and "mechanism gaussian" in card and "-DP under the gaussian" in card
    state = json.loads((out / "trainer_state.json").read_text()) if (out / "trainer_state.json").is_file() else None
    assert state is None or any("epsilon" in entry for entry in state["log_history"])


def test_a_peft_model_trains_its_adapters_only(tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=2, lora_alpha=4, target_modules=["query", "value"])
    model = peft.get_peft_model(tiny_bert(), config)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if not p.requires_grad}
    private = trainer(tmp_path, model=model, args=arguments(tmp_path, max_steps=2))
    quietly(private.train)
    assert private.privacy_engine.steps == 2
    assert private.privacy_engine.setup.params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert all(torch.equal(p, frozen[name]) for name, p in model.named_parameters() if name in frozen)


def test_privacy_units_make_the_epsilon_per_user(tmp_path):
    users = [i // 4 for i in range(EXAMPLES)]  # 16 users of 4 sentences
    run = trainer(tmp_path, args=arguments(tmp_path, per_device_train_batch_size=32, max_steps=3),
                  logical_batch_size=4, privacy_unit=users)
    quietly(run.train)
    setup = run.privacy_engine.setup
    assert setup.privacy_units == 16 and setup.sample_rate == pytest.approx(4 / 16)
    assert run.privacy_engine.steps == 3
    assert "each of the 16 privacy units, all its examples together" in run.privacy_statement()
    with pytest.raises(InvalidTrainingOptionError, match="privacy_unit 'user' names no column"):
        trainer(tmp_path, privacy_unit="user")
