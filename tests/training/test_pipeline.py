"""The training pipeline as a library call: ``train_private(TrainingConfig) -> TrainingResult``."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from dpnoise.cli.main import main
from dpnoise.errors import DpnoiseError
from dpnoise.training import (
    DataConfig,
    ExecutionOptions,
    InvalidConfigError,
    OptimizerConfig,
    OutputConfig,
    PrivacyEngine,
    PrivacyOptions,
    Schedule,
    TrainingConfig,
    TrainingResult,
    train_private,
)
from dpnoise.training import config as config_module
from dpnoise.training.summary import SUMMARY_FIELDS

#: a few seconds of training: 512 digits, 8 steps of 64
TINY = TrainingConfig(
    data=DataConfig("digits", limit=512, test_limit=100),
    privacy=PrivacyOptions(mechanism="lap2", delta=1e-5, target_epsilon=2.0, epochs=1),
    schedule=Schedule(batch_size=64),
    optimizer=OptimizerConfig(lr=0.01),
    output=OutputConfig(progress=False),
    noise_seed=0,  # reproducible, so that the command line's run can be compared
    threads=1,
)
TINY_ARGV = ["train", "--dataset", "digits", "--limit", "512", "--test-limit", "100", "--mechanism", "lap2",
             "--delta", "1e-5", "--epsilon", "2", "--epochs", "1", "--batch-size", "64", "--lr", "0.01",
             "--noise-seed", "0", "--threads", "1", "--no-progress", "--json"]


def with_field(config: TrainingConfig, path: str, value) -> TrainingConfig:
    """``config`` with the field at the dotted ``path`` replaced, built from its dotted fields (checked by name)."""
    fields = {p: config_module.field_value(config, p) for p in config_module.OPTIONS}
    return TrainingConfig.from_fields({**fields, path: value})


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory) -> TrainingResult:
    folder = tmp_path_factory.mktemp("run") / "out"
    return train_private(with_field(TINY, "output.folder", str(folder)))


def test_library_run_is_the_command_line_run(tiny_result, capsys):
    assert main(TINY_ARGV) == 0
    from_cli = json.loads(capsys.readouterr().out)
    assert tiny_result.test_accuracy == from_cli["test_accuracy"]
    assert tiny_result.epsilon == from_cli["epsilon"]
    assert tiny_result.epsilon_by_accountant == from_cli["epsilon_by_accountant"]
    summary = tiny_result.summary()
    for name in ("wall_time_s", "files"):
        summary.pop(name)
        from_cli.pop(name, None)
    assert summary == from_cli


def test_result_carries_the_configuration_it_ran(tiny_result):
    ran = TrainingConfig.from_fields(tiny_result.config)
    assert ran == with_field(TINY, "output.folder", ran.output.folder)
    assert "optimizer.momentum" not in tiny_result.config and tiny_result.momentum == 0.0  # a default, not written
    assert (tiny_result.dataset, tiny_result.batch_size, tiny_result.epochs) == ("digits", 64, 1)


def test_result_has_the_fields_of_the_report(tiny_result):
    assert all(hasattr(tiny_result, name) for name in SUMMARY_FIELDS)
    summary = tiny_result.summary()
    assert list(summary)[: len(SUMMARY_FIELDS)] == list(SUMMARY_FIELDS)
    assert tiny_result.steps == tiny_result.planned_steps == 8  # ceil(1 / q), q = 64 / 512
    assert set(tiny_result.epsilon_by_accountant) == {"lap2", "lap2-rdp", "lap2-gdp", "lap2-paper"}
    assert tiny_result.epsilon == tiny_result.epsilon_by_accountant["lap2"] <= 2.0
    assert tiny_result.sound_by_accountant["lap2-paper"] is False
    assert tiny_result.calibrated_with == "lap2" and tiny_result.noise > 0 and tiny_result.options == {}
    assert 0.0 <= tiny_result.test_accuracy <= 1.0 and tiny_result.wall_time_s > 0
    assert [s.step for s in tiny_result.history.steps] == list(range(1, 9))
    assert [e.step for e in tiny_result.history.epochs] == [8]
    assert tiny_result.history.epochs[-1].test_accuracy == tiny_result.test_accuracy


def test_result_lists_the_files_it_wrote(tiny_result):
    names = [Path(p).name for p in tiny_result.files]
    assert names == ["metrics.json", "steps.csv", "epochs.csv", "curves.png"]
    folder = Path(tiny_result.files[0]).parent
    assert (folder / config_module.CHECKPOINT_NAME).stat().st_size > 0
    assert json.loads((folder / "metrics.json").read_text()) == json.loads(json.dumps(tiny_result.metrics()))
    assert tiny_result.summary()["files"] == [str(p) for p in tiny_result.files]


BAD_FIELDS = [
    ("privacy.target_epsilon", float("nan"), "privacy.target_epsilon must"),
    ("privacy.noise", 0.0, "privacy.noise must"),
    ("privacy.delta", 1.0, "privacy.delta must"),
    ("privacy.max_grad_norm", -1.0, "privacy.max_grad_norm must"),
    ("privacy.epochs", float("inf"), "privacy.epochs must"),
    ("schedule.batch_size", 0, "schedule.batch_size must"),
    ("schedule.batch_size", 513, "schedule.batch_size must be <= 512"),
    ("optimizer.momentum", 1.0, "optimizer.momentum must"),
    ("optimizer.momentum", 0.5, "optimizer.momentum applies to optimizer.name sgd only, got 0.5 with 'adam'"),
    ("optimizer.name", "rmsprop", "optimizer.name must be one of adam, sgd"),
    ("data.limit", 5000, "data.limit must be <= 1437"),
    ("data.name", "imagenet", "data.name must be one of"),
    ("data.max_length", 1, "data.max_length must"),
    ("data.max_length", 100, "data.max_length applies to text datasets; digits is an image dataset"),
    ("model", "minilm", "model minilm cannot be trained on the image dataset digits"),
    ("privacy.accountant", "gaussian", "privacy.accountant 'gaussian' does not apply to privacy.mechanism lap2"),
    ("execution.grad_sample_mode", "fast", "execution.grad_sample_mode must be one of"),
    ("seed", -1, "seed must"),
    ("threads", 0, "threads must"),
    ("execution.device", "tpu", "execution.device must be one of auto, cpu, cuda, got 'tpu'"),
    ("execution.noise_shares", "half", "execution.noise_shares must be one of split, rank0"),
]


@pytest.fixture
def no_work(monkeypatch):
    """Loading data or building the model fails the test: the configuration is checked first."""
    import dpnoise.data
    import dpnoise.models

    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the configuration was checked")

    monkeypatch.setattr(dpnoise.data, "load_dataset", forbidden)
    monkeypatch.setattr(dpnoise.models, "build_model", forbidden)


@pytest.mark.parametrize("path,value,message", BAD_FIELDS, ids=[f"{p}={v}" for p, v, _ in BAD_FIELDS])
def test_invalid_config_names_the_field_before_any_work(no_work, path, value, message):
    with pytest.raises(InvalidConfigError) as caught:
        train_private(with_field(TINY, path, value))
    assert str(caught.value).startswith(message.split(" must")[0]) and message in str(caught.value)
    assert isinstance(caught.value, DpnoiseError) and "\n" not in str(caught.value)


def test_errors_can_name_the_fields_as_a_front_end_does(no_work):
    with pytest.raises(InvalidConfigError) as caught:
        train_private(with_field(TINY, "privacy.calibrate_with", "dirichlet"))
    flags = caught.value.named(lambda path: config_module.OPTIONS[path].flag)
    assert flags.startswith("--calibrate-with 'dirichlet' does not apply to --mechanism lap2; choose from")
    with pytest.raises(InvalidConfigError, match=r"give privacy.noise \(fixed noise\), or privacy.target_epsilon "
                                                 r"and privacy.epochs"):
        with_field(TINY, "privacy.target_epsilon", None)  # privacy.noise is None too


def test_a_run_of_no_step_or_an_uncalibrated_calibrate_with_is_refused(no_work):
    with pytest.raises(InvalidConfigError, match=r"^privacy.epochs: .* fewer than one step"):
        train_private(with_field(TINY, "privacy.epochs", 1e-12))  # ceil(1e-12 / q) is no step
    fixed = with_field(TINY, "privacy.noise", 1.0)
    with pytest.raises(InvalidConfigError, match="privacy.calibrate_with applies only when the noise is calibrated"):
        train_private(with_field(fixed, "privacy.calibrate_with", "lap2-rdp"))


def test_report_rounds_the_noise_toward_privacy_and_names_an_unevaluated_run(tiny_result):
    from dpnoise.training.summary import report_lines

    summary = tiny_result.summary()
    printed = float(report_lines(summary)[1].split("noise ")[1].split(" ")[0])
    assert printed >= summary["noise"] and printed == pytest.approx(summary["noise"], rel=1e-5)  # b: up
    dirichlet = {**summary, "mechanism": "dirichlet", "noise": 0.08041335630078805}
    assert "noise 0.0804133 " in report_lines(dirichlet)[1]  # r: down (nearest: 0.0804134)
    assert report_lines({**summary, "test_accuracy": None})[0].startswith("test accuracy: not evaluated")


def test_the_report_lists_gradient_sources_by_layer_unless_all_are_book_keeping(tiny_result):
    from dpnoise.training.summary import report_lines

    assert set(tiny_result.gradient_sources.values()) == {"book-keeping rule", "book-keeping, materialised"}  # the CNN
    assert "gradient_sources" not in tiny_result.summary()
    hooks = dataclasses.replace(tiny_result, grad_sample_mode="hooks", gradient_sources={
        "scaled (Scaled)": "hooks, functorch", "conv (Conv2d)": "hooks, grad sampler", "fc (Linear)": "hooks, grad sampler"})
    assert hooks.summary()["gradient_sources"] == hooks.gradient_sources
    assert ("per-example gradients by layer: hooks, functorch: scaled (Scaled); hooks, grad sampler: conv (Conv2d), "
            "fc (Linear)") in report_lines(hooks.summary())


def test_the_progress_log_and_the_report_print_each_epsilon_rounded_up(capsys):
    """Two steps at b = 4: epsilon 0.257932..., which rounded to nearest would print as 0.2579, below the bound."""
    from dpnoise.training.summary import report_lines

    fixed = with_field(with_field(TINY, "privacy.noise", 4.0), "privacy.target_epsilon", None)
    result = train_private(with_field(fixed, "schedule.max_steps", 2))
    logged = float(re.search(r"epsilon \(lap2\) (\S+)", capsys.readouterr().err).group(1))
    assert result.epsilon <= logged <= result.epsilon + 1e-4
    printed = dict(re.findall(r"^ +(\S+): (\S+)  \(", "\n".join(report_lines(result.summary())), re.M))
    assert set(printed) == set(result.epsilon_by_accountant)
    for name, eps in result.epsilon_by_accountant.items():
        assert eps <= float(printed[name]) <= eps + 1e-4, (name, printed[name], eps)


def test_config_from_dotted_fields():
    config = TrainingConfig.from_fields({"data.name": "digits", "privacy.mechanism": "gaussian", "privacy.delta": 1e-5,
                                         "privacy.target_epsilon": 1.0, "privacy.epochs": 1, "schedule.batch_size": 64,
                                         "output.folder": "runs/x", "seed": 3})
    assert config.data == DataConfig("digits") and config.seed == 3 and config.optimizer == OptimizerConfig()
    assert config.output.folder == Path("runs/x")  # strings become paths
    for unknown in ("privacy.epsilom", "learning_rate", "data", "extra.thing"):
        with pytest.raises(ValueError, match="unknown configuration field"):
            TrainingConfig.from_fields({"data.name": "digits", unknown: 1})


def test_the_configuration_s_own_options_reach_make_private(monkeypatch):
    """No translation: the privacy section goes to ``make_private_with_options`` with the run's data releases and
    its stop at the budget, the execution section on the run's device."""
    import torch

    passed = {}

    def make_private_with_options(self, module, optimizer, loader, *, privacy, execution, loss_fn, privacy_unit):
        passed.update(privacy=privacy, execution=execution, loss_fn=loss_fn, privacy_unit=privacy_unit)
        raise AssertionError("stop here")

    monkeypatch.setattr(PrivacyEngine, "make_private_with_options", make_private_with_options)
    config = with_field(with_field(TINY, "execution.max_physical_batch_size", 16), "execution.device", "cpu")
    with pytest.raises(AssertionError, match="stop here"):
        train_private(config)
    assert type(passed["privacy"]) is PrivacyOptions and type(passed["execution"]) is ExecutionOptions
    assert passed["privacy"] == dataclasses.replace(config.privacy, on_budget_exhausted="stop")
    assert passed["execution"] == dataclasses.replace(config.execution, device=torch.device("cpu"))
    assert passed["loss_fn"] is None  # the model's own loss (no label smoothing): what the loop trains on
    assert passed["privacy_unit"] is None  # one example per unit unless the data names a unit column
