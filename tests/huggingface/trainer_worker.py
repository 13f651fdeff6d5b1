"""The private Trainer on several processes: the scenario of ``test_private_trainer_processes.py``.

Imported by the test (the model, data and options) and run as a script, one process per rank, as ``torchrun``
would start it:

    RANK=r LOCAL_RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python tests/huggingface/trainer_worker.py OUT

Each rank trains the tiny BERT with the noise switched off (the test hook ``release_sums.noise_of``) and saves
the pieces each step took, its steps, epsilon and parameters to ``OUT/rank<r>.pt``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
import transformers
from torch.utils.data import Dataset

from dpnoise.huggingface import PrivateTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # the tests' helpers, run as a script too
from training_helpers import record_draws  # noqa: E402

VOCAB, LENGTH, EXAMPLES = 40, 8, 64
#: expected Poisson batch, examples per forward pass, clipping norm, SGD's learning rate, steps
BATCH, PHYSICAL, CLIP, LR, STEPS = 16, 4, 0.5, 0.5, 3


class Sentences(Dataset):
    """Padded token ids, masks and a learnable label (the first token's parity), one dict per example."""

    def __init__(self):
        generator = torch.Generator().manual_seed(1)
        lengths = torch.randint(2, LENGTH + 1, (EXAMPLES,), generator=generator)
        self.mask = (torch.arange(LENGTH) < lengths[:, None]).long()
        self.ids = torch.randint(2, VOCAB, (EXAMPLES, LENGTH), generator=generator) * self.mask
        self.labels = self.ids[:, 0] % 2

    def __len__(self):
        return EXAMPLES

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def tiny_bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(config)


class Noiseless(transformers.TrainerCallback):
    """At the start of training: noise off and the pieces of every step recorded (``draws``)."""

    def __init__(self, trainer: PrivateTrainer):
        self.trainer, self.draws = trainer, []

    def on_train_begin(self, args, state, control, **keywords):
        self.trainer.private_optimizer.noisy_sum.release_sums.noise_of = torch.zeros_like
        self.draws = record_draws(self.trainer.privacy_engine)


def run(out: str) -> dict:
    """Train with the private Trainer on this process's share; what it saw."""
    model = tiny_bert()
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=PHYSICAL, max_steps=STEPS, learning_rate=LR,
        lr_scheduler_type="constant", save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
        logging_steps=1)
    trainer = PrivateTrainer(model, args, train_dataset=Sentences(), logical_batch_size=BATCH,
                             optimizers=(torch.optim.SGD(model.parameters(), lr=LR), None),
                             privacy={"mechanism": "gaussian", "delta": 1e-5, "noise": 1.0, "max_grad_norm": CLIP})
    callback = Noiseless(trainer)
    trainer.add_callback(callback)
    trainer.train()
    engine = trainer.privacy_engine
    return dict(draws=callback.draws, steps=engine.steps, global_step=trainer.state.global_step,
                epsilon=engine.get_epsilon(), world_size=engine.world_size,
                logged=[entry.get("private_steps") for entry in trainer.state.log_history if "epsilon" in entry],
                params={name: p.detach().clone() for name, p in model.named_parameters()})


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    result = run(sys.argv[1])
    import torch.distributed as dist

    torch.save(result, Path(sys.argv[1]) / f"rank{dist.get_rank()}.pt")
