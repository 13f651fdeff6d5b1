"""Bad input fails early with a message that says what is wrong."""

import pytest
import torch
from torch import nn

from dpnoise.accounting import MECHANISMS, UnreachableTargetError, noise_keywords
from dpnoise.accounting.validation import InvalidParameterError
from dpnoise.errors import DpnoiseError
from dpnoise.mechanisms import InvalidMechanismError
from dpnoise.training import (
    CheckpointMismatchError,
    EngineStateError,
    InvalidTrainingOptionError,
    PrivacyBudgetExceededError,
    PrivacyEngine,
    UnsupportedLayerError,
    make_private,
)

from training_helpers import digits_loader, mlp


def make(dataset, model=None, **options):
    model = model or mlp(hidden=8)
    return make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(dataset, 64),
                        **{"delta": 1e-5, **options})


@pytest.mark.parametrize("mechanism", ["lap2", "dirichlet"])
def test_batch_norm_is_refused_by_name(digits_train, mechanism):
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))
    with pytest.raises(UnsupportedLayerError, match=r"2 \(BatchNorm1d\): batch statistics"):
        make(digits_train, model, mechanism=mechanism, **noise_keywords(mechanism, 1.0))


def test_layer_opacus_cannot_handle_is_refused_by_name(digits_train):
    class WithLstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.LSTM(8, 8, batch_first=True)
            self.head = nn.Linear(8, 10)

    with pytest.raises(UnsupportedLayerError, match=r"encoder \(LSTM\)"):
        make(digits_train, WithLstm(), mechanism="gaussian", noise_multiplier=1.0)


def test_epsilon_below_the_reachable_floor(digits_train):
    with pytest.raises(UnreachableTargetError, match="unreachable"):
        make(digits_train, mechanism="dirichlet", target_epsilon=0.01, epochs=50)
    with pytest.raises(PrivacyBudgetExceededError, match="even one step"):
        make(digits_train, mechanism="gaussian", noise_multiplier=0.3, target_epsilon=0.01)


def test_inconsistent_options(digits_train):
    with pytest.raises(ValueError, match="unknown mechanism 'laplace'"):
        make(digits_train, mechanism="laplace", noise_multiplier=1.0)
    with pytest.raises(ValueError, match=r"give laplace_scale \(fixed noise\), or target_epsilon and epochs"):
        make(digits_train, mechanism="lap2", target_epsilon=1.0)
    with pytest.raises(ValueError, match="alpha does not apply to mechanism .lap2. .only to dirichlet"):
        make(digits_train, mechanism="lap2", laplace_scale=1.0, alpha=1.0)
    with pytest.raises(ValueError, match="accountant 'gaussian' does not apply to mechanism lap2"):
        make(digits_train, mechanism="lap2", laplace_scale=1.0, accountant="gaussian")
    with pytest.raises(ValueError, match="calibrate_with applies only when the noise is calibrated"):
        make(digits_train, mechanism="lap2", laplace_scale=1.0, calibrate_with="lap2-rdp")


def test_fixed_size_batches_are_warned_as_not_covered(digits_train):
    with pytest.warns(UserWarning, match="accountants assume Poisson sampling"):
        _, _, loader = make(digits_train, mechanism="lap2", laplace_scale=1.0, poisson_sampling=False)
    assert len(next(iter(loader))[1]) == 64


# -------------------------------------------------- issue 12 D: every numeric argument, before any work
BAD_POSITIVE = [0, 0.0, -1.0, float("nan"), float("inf"), -float("inf")]


@pytest.fixture
def no_work(monkeypatch):
    """Calibrating or wrapping the model fails the test: the checks must come first."""
    import dpnoise.training.engine as engine_module

    def forbidden(*args, **kwargs):
        raise AssertionError("make_private did work before checking its arguments")

    monkeypatch.setattr(engine_module, "resolve", forbidden)
    monkeypatch.setattr(engine_module, "wrap_private", forbidden)
    monkeypatch.setattr(engine_module, "training_loader", forbidden)


def refused(digits_train, name, **options):
    engine = PrivacyEngine(seed=0)
    model = mlp(hidden=8)
    with pytest.raises(InvalidParameterError, match=name) as error:
        engine.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(digits_train, 64),
                            **{"delta": 1e-5, **options})
    assert isinstance(error.value, DpnoiseError) and isinstance(error.value, ValueError)
    assert "\n" not in str(error.value)
    assert engine.setup is None and engine.accountants == {}
    assert all(not layer._forward_hooks for layer in model.modules())


@pytest.mark.parametrize("value", BAD_POSITIVE)
@pytest.mark.parametrize("mechanism", ["gaussian", "lap2", "dirichlet"])
def test_bad_noise_is_refused(digits_train, no_work, mechanism, value):
    refused(digits_train, MECHANISMS[mechanism].noise.keyword, mechanism=mechanism, **noise_keywords(mechanism, value))


@pytest.mark.parametrize("value", BAD_POSITIVE)
def test_bad_max_grad_norm_is_refused(digits_train, no_work, value):
    refused(digits_train, "max_grad_norm", mechanism="gaussian", noise_multiplier=1.0, max_grad_norm=value)


@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0, -1e-5, 2.0, float("nan"), float("inf")])
def test_bad_delta_is_refused(digits_train, no_work, value):
    refused(digits_train, "delta", mechanism="gaussian", noise_multiplier=1.0, delta=value)


@pytest.mark.parametrize("value", BAD_POSITIVE)
def test_bad_target_epsilon_is_refused(digits_train, no_work, value):
    refused(digits_train, "target_epsilon", mechanism="gaussian", target_epsilon=value, epochs=1)
    refused(digits_train, "target_epsilon", mechanism="gaussian", noise_multiplier=1.0, target_epsilon=value)


@pytest.mark.parametrize("value", BAD_POSITIVE)
def test_bad_epochs_is_refused(digits_train, no_work, value):
    refused(digits_train, "epochs", mechanism="gaussian", target_epsilon=1.0, epochs=value)


def test_epochs_that_overflow_the_step_count_are_refused(digits_train, no_work):
    refused(digits_train, "epochs", mechanism="gaussian", target_epsilon=1.0, epochs=1e308)


@pytest.mark.parametrize("value", BAD_POSITIVE)
def test_bad_dirichlet_alpha_is_refused(digits_train, no_work, value):
    refused(digits_train, "alpha", mechanism="dirichlet", concentration=1.0, alpha=value)


@pytest.mark.parametrize("value", ["1", True, [1.0]])
def test_non_numbers_are_refused(digits_train, no_work, value):
    refused(digits_train, "noise", mechanism="gaussian", noise_multiplier=value)


def test_batch_larger_than_the_dataset_is_refused(digits_train, no_work):
    engine = PrivacyEngine(seed=0)
    model = mlp(hidden=8)
    with pytest.raises(InvalidParameterError, match="batch_size / len"):
        engine.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(digits_train, 5000),
                            mechanism="gaussian", noise_multiplier=1.0, delta=1e-5)


def test_empty_dataset_is_refused(no_work):
    from torch.utils.data import DataLoader, TensorDataset

    model = mlp(hidden=8)
    empty = TensorDataset(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.long))
    with pytest.raises(InvalidParameterError, match="empty"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(empty, batch_size=4),
                     mechanism="gaussian", noise_multiplier=1.0, delta=1e-5)


def test_option_errors_are_dpnoise_errors(digits_train):
    for options, error in [
        (dict(mechanism="laplace", noise_multiplier=1.0), InvalidMechanismError),
        (dict(mechanism="lap2", laplace_scale=1.0, on_budget_exhausted="ignore"), InvalidTrainingOptionError),
        (dict(mechanism="lap2", laplace_scale=1.0, grad_sample_mode="fast"), InvalidTrainingOptionError),
        (dict(mechanism="lap2", laplace_scale=1.0, accountant="gaussian"), InvalidTrainingOptionError),
    ]:
        with pytest.raises(error) as caught:
            make(digits_train, **options)
        assert isinstance(caught.value, DpnoiseError) and isinstance(caught.value, ValueError)


def test_making_private_twice_is_a_dpnoise_error(digits_train):
    engine = PrivacyEngine(seed=0)
    model = mlp(hidden=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine.make_private(model, optimizer, digits_loader(digits_train, 64), mechanism="lap2", laplace_scale=1.0, delta=1e-5)
    with pytest.raises(EngineStateError) as caught:
        engine.make_private(model, optimizer, digits_loader(digits_train, 64), mechanism="lap2", laplace_scale=1.0, delta=1e-5)
    assert isinstance(caught.value, DpnoiseError) and isinstance(caught.value, RuntimeError)


def test_every_deliberate_error_is_a_dpnoise_error_and_keeps_its_builtin_base():
    from dpnoise.data import DatasetNotAvailableError, InvalidDatasetError
    from reproductions.errors import PlanMismatchError
    from dpnoise.models import InvalidModelError, ModelNotAvailableError
    from dpnoise.training.errors import CheckpointError

    for error, builtin in [
        (DatasetNotAvailableError, FileNotFoundError), (ModelNotAvailableError, FileNotFoundError),
        (InvalidDatasetError, ValueError), (InvalidModelError, ValueError), (InvalidMechanismError, ValueError),
        (UnsupportedLayerError, ValueError), (CheckpointMismatchError, ValueError), (CheckpointError, ValueError),
        (InvalidTrainingOptionError, ValueError), (PrivacyBudgetExceededError, RuntimeError),
        (EngineStateError, RuntimeError), (PlanMismatchError, RuntimeError),
    ]:
        assert issubclass(error, DpnoiseError) and issubclass(error, builtin), error


# -------------------------------------------------- issue 22 part 6: the model, the optimizer, the configuration
def _frozen(model):
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


@pytest.mark.parametrize("mechanism", ["gaussian", "dirichlet"])
@pytest.mark.parametrize("case, match", [
    ("frozen model", "module has no trainable parameters"),
    ("model without parameters", "module has no trainable parameters"),
    ("another model's parameters", "not parameters of module"),
    ("one more tensor", "1 tensor"),
    ("frozen parameters only", "none of module's trainable parameters"),
    ("not an optimizer", "optimizer must be a torch.optim.Optimizer"),
])
def test_an_optimizer_that_does_not_train_the_model_is_refused_before_any_work(digits_train, no_work, mechanism,
                                                                             case, match):
    model, other = mlp(hidden=8), mlp(hidden=8, seed=1)
    if case == "frozen model":
        model, parameters = _frozen(model), model.parameters()
    elif case == "model without parameters":
        model, parameters = nn.Flatten(), other.parameters()
    elif case == "another model's parameters":
        parameters = other.parameters()
    elif case == "one more tensor":
        parameters = [*model.parameters(), torch.zeros(3, requires_grad=True)]
    elif case == "frozen parameters only":
        _frozen(model[1])
        parameters = model[1].parameters()
    optimizer = "sgd" if case == "not an optimizer" else torch.optim.SGD(parameters, lr=0.1)
    engine = PrivacyEngine(seed=0)
    with pytest.raises(InvalidTrainingOptionError, match=match) as caught:
        engine.make_private(model, optimizer, digits_loader(digits_train, 64), mechanism=mechanism, delta=1e-5,
                            **noise_keywords(mechanism, 0.5))
    assert "\n" not in str(caught.value) and engine.setup is None


def test_frozen_parameters_of_the_model_may_be_in_the_optimizer(digits_train):
    model = mlp(hidden=8)
    _frozen(model[1])
    _, optimizer, _ = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), digits_loader(digits_train, 64),
                                   mechanism="gaussian", noise_multiplier=1.0, delta=1e-5)
    assert optimizer.privacy_engine.setup.params == sum(p.numel() for p in model[3].parameters())


@pytest.mark.parametrize("section", ["data", "privacy", "schedule", "execution", "optimizer", "output"])
def test_a_configuration_section_of_the_wrong_type_is_refused_naming_it(section):
    from dpnoise.training import PrivacyOptions, train_private
    from dpnoise.training.config import DataConfig, InvalidConfigError, Schedule, TrainingConfig

    sections = {"data": DataConfig("digits"), "privacy": PrivacyOptions(mechanism="gaussian", noise=1.0, delta=1e-5,
                                                                        epochs=1), "schedule": Schedule(batch_size=64)}
    wrong = {"data": "digits", "optimizer": "adam", "schedule": (1, 64)}.get(section, {"name": "x"})
    config = TrainingConfig(**{**sections, section: wrong})
    with pytest.raises(InvalidConfigError, match=f"^{section} must be a ") as caught:
        train_private(config)
    assert "\n" not in str(caught.value)
    with pytest.raises(InvalidConfigError, match="must be a TrainingConfig"):
        train_private(sections)


@pytest.mark.parametrize("seed", ["a", -1, 1.5, 2**64, True])
def test_an_engine_seed_that_is_not_a_seed_is_refused_by_name(seed):
    from dpnoise.training import PrivacyEngine

    with pytest.raises(DpnoiseError, match="^seed "):
        PrivacyEngine(seed=seed)


def test_options_of_the_wrong_type_are_refused_by_name(digits_train):
    from dpnoise.training import PrivacyEngine, PrivacyOptions
    from dpnoise.training.config import TrainingConfig

    model = torch.nn.Linear(64, 10)
    privacy = PrivacyOptions(mechanism="lap2", delta=1e-5, noise=1.0)
    for options, message in (({"privacy": privacy, "execution": None}, "^execution must be an ExecutionOptions"),
                             ({"privacy": {"mechanism": "lap2"}}, "^privacy must be a PrivacyOptions")):
        with pytest.raises(DpnoiseError, match=message):
            PrivacyEngine(seed=0).make_private_with_options(
                model, torch.optim.SGD(model.parameters(), lr=0.1),
                torch.utils.data.DataLoader(digits_train, batch_size=64), **options)
    with pytest.raises(DpnoiseError, match="takes a mapping of dotted field paths"):
        TrainingConfig.from_fields([("seed", 0)])
    with pytest.raises(DpnoiseError, match="field paths are strings"):
        TrainingConfig.from_fields({5: 0})


def test_a_loss_fn_that_is_not_a_function_is_refused_by_name(digits_train):
    from dpnoise.training import check_per_example, make_private

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    with pytest.raises(DpnoiseError, match="^loss_fn must be None or a function"):
        make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                     torch.utils.data.DataLoader(digits_train, batch_size=64), mechanism="lap2", laplace_scale=1.0,
                     delta=1e-5, loss_fn=5)
    with pytest.raises(DpnoiseError, match="^loss_fn must be None or a function"):
        check_per_example(model, "cross_entropy", digits_train[:4])
