"""Private supervised fine-tuning of a causal language model with TRL: dpnoise's PrivateSFTTrainer.

A GPT-2 configuration trained from its random initialisation (no pretrained causal LM is installable here)
on prompt-completion pairs made from SST-2 sentences ("Review: <sentence> Sentiment:" -> " positive" /
" negative"), loss on the completion only, each sequence's own; MiniLM-L6's tokenizer.  Prints the
held-out perplexity of the completions and the epsilon; ``--epsilon 0`` trains without privacy.

    python examples/private_sft.py                      # tiny, seconds
    python examples/private_sft.py --examples 20000 --steps 300 --width 256 --layers 4
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile

import torch
import transformers
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from dpnoise.data import load_dataset, minilm_tokenizer
from dpnoise.huggingface import PrivateSFTTrainer


def pairs(split: str, limit: int) -> Dataset:
    data = load_dataset("sst2", split, limit=limit)
    return Dataset.from_dict({"prompt": [f"Review: {s} Sentiment:" for s in data.sentences],
                              "completion": [" positive" if int(y) else " negative" for y in data.labels]})


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilon", type=float, default=3.0, help="target epsilon (0: without privacy; default 3)")
    p.add_argument("--examples", type=int, default=256, help="training pairs (default 256)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps (default 8)")
    p.add_argument("--batch-size", type=int, default=32, help="expected Poisson batch (default 32)")
    p.add_argument("--width", type=int, default=32, help="GPT-2 hidden size (default 32)")
    p.add_argument("--layers", type=int, default=1, help="GPT-2 layers (default 1)")
    args = p.parse_args(argv)
    tokenizer = minilm_tokenizer()
    tokenizer.eos_token = tokenizer.sep_token  # a BERT tokenizer: [SEP] ends a completion
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tokenizer.vocab_size, n_embd=args.width, n_layer=args.layers, n_head=2, n_positions=128,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id))
    config = SFTConfig(output_dir=tempfile.mkdtemp(prefix="private-sft-"), per_device_train_batch_size=args.batch_size,
                       max_steps=args.steps, learning_rate=1e-3, lr_scheduler_type="constant", max_length=64,
                       logging_steps=10, save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    common = dict(model=model, args=config, train_dataset=pairs("train", args.examples),
                  eval_dataset=pairs("dev", 128), processing_class=tokenizer)
    if args.epsilon > 0:
        trainer = PrivateSFTTrainer(**common, privacy={"mechanism": "gaussian", "delta": 1e-5,
                                                       "target_epsilon": args.epsilon, "max_grad_norm": 1.0})
    else:
        trainer = SFTTrainer(**common)
    trainer.train()
    loss = trainer.evaluate()["eval_loss"]
    engine = getattr(trainer, "privacy_engine", None)
    result = {"perplexity": math.exp(loss), "epsilon": engine.get_epsilon() if engine else math.inf,
              "steps": engine.steps if engine else trainer.state.global_step}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
