"""The private SFT trainer on TRL's SFTTrainer: prompt-completion (completion-only loss) and plain text data,
the per-sequence loss, packing refused (a tiny random GPT-2 with MiniLM-L6's tokenizer)."""

import warnings

import pytest
import torch

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

from dpnoise.data import minilm_tokenizer  # noqa: E402
from dpnoise.huggingface import PrivateSFTTrainer  # noqa: E402
from dpnoise.training import InvalidTrainingOptionError, causal_lm_loss  # noqa: E402

PRIVACY = {"mechanism": "gaussian", "delta": 1e-5, "target_epsilon": 3.0}


def tokenizer():
    tok = minilm_tokenizer()
    tok.eos_token = tok.sep_token  # a BERT tokenizer: its [SEP] ends a completion
    return tok


def tiny_gpt2(tok):
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tok.vocab_size, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id, pad_token_id=tok.pad_token_id))


def sft(tmp_path, data, **config):
    tok = tokenizer()
    args = trl.SFTConfig(**{"output_dir": str(tmp_path), "per_device_train_batch_size": 16, "max_steps": 3,
                            "logging_steps": 1, "report_to": [], "use_cpu": True, "save_strategy": "no",
                            "max_length": 32, "disable_tqdm": True, **config})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PrivateSFTTrainer(model=tiny_gpt2(tok), args=args, train_dataset=data, processing_class=tok,
                                 privacy=PRIVACY, noise_seed=0)


def test_completion_only_sft_takes_private_steps_on_each_sequences_completion(tmp_path):
    data = datasets.Dataset.from_dict({"prompt": [f"review {i}:" for i in range(64)],
                                       "completion": [" good" if i % 2 else " bad" for i in range(64)]})
    trainer = sft(tmp_path, data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    engine = trainer.privacy_engine
    assert engine.steps == 3 and engine.get_epsilon() <= 3.0 and trainer.loss_fn is causal_lm_loss
    assert engine.per_example_report.exactness.error < 1e-6  # each sequence's gradient its own
    batch = next(iter(trainer._private_loader))
    predicted = batch["labels"] != -100
    assert predicted.any() and not predicted[:, :3].any()  # the prompt's tokens are not predicted
    assert all("loss" not in entry for entry in trainer.state.log_history)


def test_plain_text_sft_and_packing_refused(tmp_path):
    data = datasets.Dataset.from_dict({"text": [f"a sentence number {i} about films" for i in range(64)]})
    trainer = sft(tmp_path, data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert trainer.privacy_engine.steps == 3
    with pytest.raises(InvalidTrainingOptionError, match="packing joins several examples into one row"):
        sft(tmp_path, data, packing=True)
