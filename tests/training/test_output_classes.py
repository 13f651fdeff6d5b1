"""The Dirichlet mechanism's number of classes: recorded in every step's event, checked on every release."""

import dataclasses

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from dpnoise.accounting import epsilon_of_events
from dpnoise.accounting.events import PoissonSampledEvent
from dpnoise.mechanisms.errors import InvalidMechanismError
from dpnoise.training import make_private
from dpnoise.training.errors import InvalidTrainingOptionError

from training_helpers import digits_loader

OPTIONS = dict(mechanism="dirichlet", concentration=0.5, delta=1e-5, seed=0)


def binary_digits(digits_train):
    x, y = digits_train.tensors if isinstance(digits_train, TensorDataset) else digits_train[:]
    return TensorDataset(x.reshape(len(x), -1).float(), (y % 2).long())


def private(dataset, classes, **options):
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return make_private(model, optimizer, digits_loader(dataset, 64), **{**OPTIONS, **options})


def test_two_classes_are_accounted_by_the_exact_two_class_route(digits_train):
    dataset = binary_digits(digits_train)
    module, optimizer, loader = private(dataset, 2, num_classes=2)
    engine = optimizer.privacy_engine
    assert engine.setup.options["num_classes"] == 2 and engine.step_event.event.num_classes == 2
    x, y = next(iter(loader))
    optimizer.zero_grad()
    F.nll_loss(module(x), y).backward()
    optimizer.step()
    step = engine.step_event
    unrecorded = PoissonSampledEvent(step.sampling_probability, dataclasses.replace(step.event, num_classes=None))
    assert engine.get_epsilon() < epsilon_of_events("dirichlet", unrecorded, steps=1, delta=1e-5)
    assert engine.accountant.get_epsilon_and_bound(1e-5)[1].startswith("dirichlet-pld")


def test_a_release_of_another_size_is_refused(digits_train):
    module, optimizer, loader = private(binary_digits(digits_train), 3, num_classes=2)
    x, _ = next(iter(loader))
    with pytest.raises(InvalidMechanismError, match="outputs have 3 classes, but the accountants account releases of 2"):
        module(x)


def test_num_classes_is_refused_where_it_does_not_apply(digits_train):
    with pytest.raises(InvalidTrainingOptionError, match="num_classes does not apply to mechanism .gaussian. .only to dirichlet"):
        private(binary_digits(digits_train), 2, mechanism="gaussian", concentration=None, noise_multiplier=1.0,
                num_classes=2)
    with pytest.raises(ValueError, match="num_classes"):
        private(binary_digits(digits_train), 2, num_classes=1)
