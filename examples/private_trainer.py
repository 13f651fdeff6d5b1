"""Private fine-tuning with Hugging Face's Trainer: dpnoise's PrivateTrainer on SST-2 sentences.

By default a tiny randomly initialised BERT on 512 sentences (seconds, what the test suite runs); with
``--minilm`` the all-MiniLM-L6-v2 encoder (``dpnoise.models.minilm_sequence_classifier``) on the whole
training set.  Prints the evaluation accuracy and the epsilon.

    python examples/private_trainer.py                 # tiny, seconds
    python examples/private_trainer.py --minilm --epochs 1 --batch-size 256 --physical-batch-size 64
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch
import transformers
from torch.utils.data import Dataset

from dpnoise.data import load_dataset, minilm_tokenizer
from dpnoise.huggingface import PrivateTrainer


class Tokenized(Dataset):
    """SST-2 sentences tokenized to ``length`` tokens, one dict per example (what Trainer's collator stacks)."""

    def __init__(self, split: str, limit: int | None, length: int = 32):
        data = load_dataset("sst2", split, limit=limit)
        self.encoded = minilm_tokenizer()(list(data.sentences), padding="max_length", truncation=True,
                                          max_length=length, return_tensors="pt")
        self.labels = torch.as_tensor([int(label) for label in data.labels])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {**{name: values[i] for name, values in self.encoded.items()}, "labels": self.labels[i]}


def tiny_bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=minilm_tokenizer().vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, num_labels=2)
    return transformers.BertForSequenceClassification(config)


def accuracy(prediction: transformers.EvalPrediction) -> dict[str, float]:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minilm", action="store_true", help="the pretrained MiniLM-L6 encoder on all of SST-2")
    p.add_argument("--epsilon", type=float, default=3.0, help="target epsilon (default 3)")
    p.add_argument("--epochs", type=float, default=2.0, help="epochs (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch B (default 64)")
    p.add_argument("--physical-batch-size", type=int, default=32, help="examples per forward pass (default 32)")
    p.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    args = p.parse_args(argv)
    if args.minilm:
        from dpnoise.models import minilm_sequence_classifier

        model, train, test = minilm_sequence_classifier(trainable="all"), Tokenized("train", None), Tokenized("test", None)
    else:
        model, train, test = tiny_bert(), Tokenized("train", 512), Tokenized("test", 256)
    out = args.out or tempfile.mkdtemp(prefix="private-trainer-")
    training = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=args.physical_batch_size,
        gradient_accumulation_steps=max(1, args.batch_size // args.physical_batch_size),
        num_train_epochs=args.epochs, learning_rate=5e-4, logging_steps=10, save_strategy="no", report_to=[],
        use_cpu=not torch.cuda.is_available(), seed=0)
    trainer = PrivateTrainer(model, training, privacy={"mechanism": "gaussian", "delta": 1e-5,
                                                       "target_epsilon": args.epsilon, "max_grad_norm": 0.1},
                             train_dataset=train, eval_dataset=test, compute_metrics=accuracy)
    trainer.train()
    result = {"accuracy": trainer.evaluate()["eval_accuracy"], "epsilon": trainer.privacy_engine.get_epsilon(),
              "delta": trainer.privacy_engine.setup.delta, "steps": trainer.privacy_engine.steps}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
