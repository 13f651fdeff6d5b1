"""The scripts under examples/ run as a user runs them (their tiny default) and give what they print."""

import importlib.util
import warnings
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, argv: list[str]) -> dict:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return module.main(argv)


def test_the_private_trainer_example_trains_to_its_target(tmp_path):
    pytest.importorskip("transformers")
    result = run_example("private_trainer", ["--out", str(tmp_path)])
    # 512 sentences at B = 64: q = 1/8, 8 steps per epoch, 2 epochs
    assert result["steps"] == 16 and 2.9 < result["epsilon"] <= 3.0 and 0.0 <= result["accuracy"] <= 1.0


def test_the_private_sft_example_trains_to_its_target_and_without_privacy():
    pytest.importorskip("trl")
    private = run_example("private_sft", [])
    assert private["steps"] == 8 and 2.9 < private["epsilon"] <= 3.0 and private["perplexity"] > 1
    plain = run_example("private_sft", ["--epsilon", "0", "--steps", "2"])
    assert plain["epsilon"] == float("inf") and plain["steps"] == 2


def test_the_own_data_example_trains_on_a_csv_and_an_image_folder():
    pytest.importorskip("datasets")
    results = run_example("own_data", [])
    assert results["csv"]["labels"] == ["mid", "neg", "pos"] and results["imagefolder"]["labels"] == ["dark", "grey", "light"]
    assert all(run["epsilon"] <= 3.0 and 0 <= run["accuracy"] <= 1 for run in results.values())
