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


def test_the_lora_example_trains_saves_and_merges_its_adapters(tmp_path):
    pytest.importorskip("peft")
    result = run_example("private_lora", ["--out", str(tmp_path)])
    # 512 sentences at B = 64: q = 1/8, 8 steps per epoch, 2 epochs
    assert result["steps"] == 16 and 2.9 < result["epsilon"] <= 3.0 and 0.0 <= result["accuracy"] <= 1.0
    assert result["changed"] == ["lora_A", "lora_B", "modules_to_save"]  # the frozen encoder is untouched
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(result["adapters"])
    assert not result["merged_is_peft"] and result["largest_difference"] < 1e-4


def test_the_two_process_accelerate_example_has_one_processs_epsilon():
    pytest.importorskip("accelerate")
    import torch
    from torch.utils.data import DataLoader

    from dpnoise.data import load_dataset
    from dpnoise.training import make_private

    result = run_example("accelerate_two_processes", [])
    # 1437 digits at B = 64: 22 Poisson batches per pass over the data, 2 passes
    assert result["processes"] == 2 and result["steps"] == 44 and result["epsilon"] <= 3.0
    model = torch.nn.Linear(64, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, optimizer, _ = make_private(model, torch.optim.Adam(model.parameters()),
                                       DataLoader(load_dataset("digits", "train"), batch_size=64), mechanism="gaussian",
                                       target_epsilon=3.0, delta=1e-5, epochs=2, max_grad_norm=1.0)
    engine = optimizer.privacy_engine
    for _ in range(result["steps"]):
        engine.record_step()
    assert result["epsilon"] == engine.get_epsilon() and result["sample_rate"] == engine.setup.sample_rate
    assert result["accuracy"] > 0.5
