"""Private LoRA fine-tuning: a peft LoRA model trained by dpnoise's PrivateTrainer, its adapters saved and merged.

By default a tiny randomly initialised BERT on 512 SST-2 sentences (seconds, what the test suite runs); with
``--minilm`` the pretrained all-MiniLM-L6-v2 encoder on the whole training set.  Only the LoRA adapters and the
classification head (which peft trains with them) receive gradients: each example's gradient is clipped and
noised over those parameters only, and the frozen encoder is left exactly as it was.  The script then saves
the adapters with ``save_pretrained`` (``trainer.save_model()``), loads them back onto a fresh base model,
merges them into the base weights with ``unwrap().merge_and_unload()``, and checks that the three give the same
predictions.  Prints the accuracy, the epsilon and the steps.

    python examples/private_lora.py                  # tiny, seconds
    python examples/private_lora.py --minilm --epochs 1 --batch-size 256 --physical-batch-size 64
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import peft
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


def base_model(minilm: bool) -> torch.nn.Module:
    """The model the adapters are added to, the same at every call (seeded): MiniLM-L6 or a tiny BERT."""
    torch.manual_seed(0)
    if minilm:
        from dpnoise.models.minilm import load_pretrained_minilm

        return load_pretrained_minilm(2)
    config = transformers.BertConfig(vocab_size=minilm_tokenizer().vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, num_labels=2)
    return transformers.BertForSequenceClassification(config)


def with_adapters(model: torch.nn.Module, rank: int) -> peft.PeftModel:
    """LoRA adapters of ``rank`` on the attention's query and value maps; the head trains too, the rest is frozen."""
    config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                             target_modules=["query", "value"])
    return peft.get_peft_model(model, config)


def accuracy(prediction: transformers.EvalPrediction) -> dict[str, float]:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**{name: values for name, values in batch.items() if name != "labels"}).logits


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minilm", action="store_true", help="the pretrained MiniLM-L6 encoder on all of SST-2")
    p.add_argument("--rank", type=int, default=4, help="LoRA rank (default 4)")
    p.add_argument("--epsilon", type=float, default=3.0, help="target epsilon (default 3)")
    p.add_argument("--epochs", type=float, default=2.0, help="epochs (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch B (default 64)")
    p.add_argument("--physical-batch-size", type=int, default=32, help="examples per forward pass (default 32)")
    p.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    args = p.parse_args(argv)
    limits = (None, None) if args.minilm else (512, 256)
    train, test = Tokenized("train", limits[0]), Tokenized("test", limits[1])
    model = with_adapters(base_model(args.minilm), args.rank)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    out = Path(args.out or tempfile.mkdtemp(prefix="private-lora-"))
    training = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.physical_batch_size,
        gradient_accumulation_steps=max(1, args.batch_size // args.physical_batch_size),
        num_train_epochs=args.epochs, learning_rate=2e-3, logging_steps=10, save_strategy="no", report_to=[],
        use_cpu=not torch.cuda.is_available(), seed=0, disable_tqdm=True)
    trainer = PrivateTrainer(model, training, privacy={"mechanism": "gaussian", "delta": 1e-5,
                                                       "target_epsilon": args.epsilon, "max_grad_norm": 0.1},
                             train_dataset=train, eval_dataset=test, compute_metrics=accuracy)
    trainer.train()
    engine = trainer.privacy_engine
    changed = [name for name, p in model.named_parameters() if not torch.equal(p, before[name])]
    assert changed and set(changed) <= set(trainable), "a frozen parameter changed, or nothing trained"
    evaluation = trainer.evaluate()

    trainer.save_model(str(out / "adapters"))  # peft's save_pretrained: the adapters and the head, with the model card
    batch = {name: values[:16].to(trainer.args.device) for name, values in test.encoded.items()}
    trained = logits(model, batch)
    reloaded = peft.PeftModel.from_pretrained(base_model(args.minilm), str(out / "adapters")).to(trainer.args.device)
    merged = trainer.model_wrapped.unwrap().merge_and_unload()  # the private module's model: the peft model
    difference = max((logits(reloaded, batch) - trained).abs().max().item(),
                     (logits(merged, batch) - trained).abs().max().item())
    assert difference < 1e-4, f"the saved or merged adapters predict otherwise (by {difference:g})"

    result = {"accuracy": evaluation["eval_accuracy"], "epsilon": engine.get_epsilon(),
              "delta": engine.setup.delta, "steps": engine.steps,
              "trainable_parameters": sum(before[name].numel() for name in trainable),
              "changed": sorted({name.split(".")[-3] for name in changed}),
              "adapters": sorted(path.name for path in (out / "adapters").iterdir()),
              "merged_is_peft": isinstance(merged, peft.PeftModel), "largest_difference": difference}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
