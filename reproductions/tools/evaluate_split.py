"""Accuracy of finished runs' final models on another split: post-processing of the released model,
at no privacy cost.

For each record of ``--experiment`` whose run left its final checkpoint in ``--work-dir``
(``<work-dir>/<experiment>/<name>/checkpoint.pt``), the run's model is rebuilt from the record's
configuration, given the checkpoint's parameters (verified as ``dpnoise train --resume`` verifies
them) and evaluated on the whole ``--split``; one JSON file per run is written to
``<results-dir>/<experiment>/<split>-split/<name>.json`` (a subfolder: the experiment's own records
stay the only JSON files at its top).  E.g. the SST-2 models on the labelled 1,821-sentence test set:

    .venv/bin/python -m reproductions.tools.evaluate_split --experiment finetune-full --split test \
        --only T300
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from reproductions.records import RunSpec, write_record
from reproductions.runner import git_state, train_config
from reproductions.tools import add_finished_run_options, finished_records

#: the prefix of a wrapped model's parameter names in a checkpoint (the engine's module wrapper)
WRAPPED_PREFIX = "_module."


def spec_of(record: dict) -> RunSpec:
    """The run specification a record was made from."""
    return RunSpec(**{f.name: record[f.name] for f in dataclasses.fields(RunSpec) if f.name in record})


def split_accuracy(record: dict, checkpoint: Path, split: str) -> tuple[float, int]:
    """(accuracy, number of examples) of ``checkpoint``'s model on the whole ``split``."""
    import torch
    from torch.utils.data import DataLoader

    from dpnoise.training.checkpoint import read_checkpoint
    from dpnoise.training.loop import evaluate_accuracy
    from dpnoise.training.preparation import batch_collation, load_splits, model_for_dataset

    config = train_config(spec_of(record), checkpoint.parent)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, eval_split=split, test_limit=None))
    torch.set_num_threads(config.threads or 1)
    model = model_for_dataset(config)
    state = read_checkpoint(checkpoint)["module"]
    model.load_state_dict({name.removeprefix(WRAPPED_PREFIX): value for name, value in state.items()}, strict=True)
    evaluated = load_splits(config)[1]
    loader = DataLoader(evaluated, batch_size=256, **batch_collation(evaluated))
    return evaluate_accuracy(model.eval(), loader), len(evaluated)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_finished_run_options(parser)
    parser.add_argument("--split", required=True, help="the split to evaluate on, e.g. test")
    args = parser.parse_args(argv)
    code_state = git_state(Path(__file__).resolve().parents[2])
    for record in finished_records(args):
        checkpoint = args.work_dir / args.experiment / record["name"] / "checkpoint.pt"
        if not checkpoint.is_file():
            print(f"skipped {record['name']}: no checkpoint at {checkpoint}", file=sys.stderr)
            continue
        accuracy, size = split_accuracy(record, checkpoint, args.split)
        out = args.results_dir / args.experiment / f"{args.split}-split" / f"{record['name']}.json"
        write_record(out, {"name": record["name"], "split": args.split, "examples": size, "accuracy": accuracy,
                           "recorded_accuracy": record["accuracy"], "recorded_split": record.get("eval_split"),
                           "command": " ".join(["python -m reproductions.tools.evaluate_split", *(argv or sys.argv[1:])]),
                           **code_state})
        print(f"{record['name']}: {100 * accuracy:.2f}% of {size} ({args.split}); recorded "
              f"{100 * record['accuracy']:.2f}% ({record.get('eval_split') or 'test'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
