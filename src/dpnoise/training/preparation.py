"""Data, model and optimiser of a private training run, prepared from a :class:`TrainingConfig`.

Images are normalised, text is tokenised for MiniLM, and the ``*-features`` models are split into a
frozen public encoder (run once over the data, its features cached) and the linear head that is
trained privately.  The data and model registries are imported when a function runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpnoise.training.config import (
    DEFAULT_LR,
    DEFAULT_MAX_LENGTH,
    TEXT_MODELS,
    InvalidConfigError,
    TrainingConfig,
    check_field,
)

#: models with a choice of trainable parameters (``trainable``, ``lora_rank``), on dict batches
TRAINABLE_MODELS = ("minilm",)
#: models that take RGB images in [0, 1] and scale them themselves (the dataset is not normalised)
UNIT_PIXEL_MODELS = ("efficientnet-lite0",)
#: models with an input ``resolution``
RESOLUTION_MODELS = ("efficientnet-lite0", "efficientnet-lite0-features")
#: models whose head starts with a ``norm`` layer that ``data.feature_statistics_noise`` replaces
STANDARDIZED_MODELS = ("scatternet-linear", "scatternet-cnn")
#: the statistics' noise generator is seeded from the run's seed plus this (not the engine's streams)
STATISTICS_SEED_OFFSET = 7919

if TYPE_CHECKING:  # annotations only
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from dpnoise.accounting.events import DpEvent
    from dpnoise.models import FeatureClassifier
    from dpnoise.training.engine import PrivacyEngine


def check_against_registries(config: TrainingConfig) -> None:
    """The checks that need the registries: names, the dataset's sizes, the runnable mechanisms."""
    from dpnoise.data import DATASETS, dataset_info
    from dpnoise.mechanisms import RUNNABLE_MECHANISMS
    from dpnoise.models import MODELS, TRAINABLE_PARTS

    data, mechanism, schedule = config.data, config.privacy.mechanism, config.schedule
    register_own_data(config)
    for path, value, known in (("data.name", data.name, sorted(DATASETS)), ("model", config.model, MODELS),
                               ("privacy.mechanism", mechanism, sorted(RUNNABLE_MECHANISMS))):
        if value not in known:
            raise InvalidConfigError(lambda n, path=path, value=value, known=known:
                                     f"{n(path)} must be one of {', '.join(known)}, got {value!r}")
    info = dataset_info(data.name)
    if (config.model in TEXT_MODELS) != (info.modality == "text"):
        raise InvalidConfigError(lambda n: f"{n('model')} {config.model} cannot be trained on the {info.modality} "
                                           f"dataset {data.name}")
    if data.max_length is not None and info.modality != "text":
        raise InvalidConfigError(lambda n: f"{n('data.max_length')} applies to text datasets; {data.name} is an "
                                           f"{info.modality} dataset")
    if config.model in RESOLUTION_MODELS and info.input_shape[0] != 3:
        raise InvalidConfigError(lambda n: f"{n('model')} {config.model} needs RGB images; {data.name} is not RGB")
    if config.resolution is not None and config.model not in RESOLUTION_MODELS:
        raise InvalidConfigError(lambda n: f"{n('resolution')} applies to {n('model')} {', '.join(RESOLUTION_MODELS)}, "
                                           f"not {config.model}")
    if config.trainable is not None and (config.model not in TRAINABLE_MODELS or config.trainable not in TRAINABLE_PARTS):
        raise InvalidConfigError(lambda n: f"{n('trainable')} applies to {n('model')} {', '.join(TRAINABLE_MODELS)} "
                                           f"and is one of {', '.join(TRAINABLE_PARTS)}; got {config.trainable!r} "
                                           f"with {config.model}")
    if config.model in TRAINABLE_MODELS and RUNNABLE_MECHANISMS[mechanism].spec.scope is not None:
        raise InvalidConfigError(lambda n: f"{n('model')} {config.model} trains on dict batches, with the gradient "
                                           f"mechanisms only; {n('privacy.mechanism')} {mechanism} perturbs the "
                                           f"outputs (for it, use minilm-features)")
    if data.eval_split not in info.splits:
        raise InvalidConfigError(lambda n: f"{n('data.eval_split')} {data.eval_split} does not exist for {data.name} "
                                           f"(its splits: {', '.join(info.splits)})")
    for path, limit, size in (("data.limit", data.limit, info.train_size),
                              ("data.test_limit", data.test_limit, info.size(data.eval_split))):
        if limit is not None and limit > size:
            raise InvalidConfigError(lambda n, path=path, limit=limit, size=size:
                                     f"{n(path)} must be <= {size} (the {data.name} split's size), got {limit}")
    train_size = data.limit or info.train_size
    if schedule.batch_size > train_size:
        raise InvalidConfigError(lambda n: f"{n('schedule.batch_size')} must be <= {train_size} (the training "
                                           f"set's size; q = batch / N <= 1), got {schedule.batch_size}")
    check_field("privacy.epochs", "finite_steps", config.privacy.epochs, schedule.batch_size / train_size)
    if data.feature_statistics_noise is not None and (config.model not in STANDARDIZED_MODELS
                                                      or RUNNABLE_MECHANISMS[mechanism].spec.scope is not None):
        raise InvalidConfigError(lambda n: f"{n('data.feature_statistics_noise')} applies to the models "
                                           f"{', '.join(STANDARDIZED_MODELS)} with a gradient mechanism, not "
                                           f"{config.model} with {mechanism}")


def register_own_data(config: TrainingConfig) -> None:
    """Read and register a data set named by its source (``csv:PATH``, ...: :mod:`dpnoise.data.files`) with
    the configuration's columns; a problem with it names ``data.name``."""
    from dpnoise.checks import parse_source
    from dpnoise.data import InvalidDatasetError, register_file_dataset
    from dpnoise.data.files import DEFAULT_EVAL_FRACTION

    data = config.data
    if parse_source(data.name) is None:
        return
    try:
        register_file_dataset(data.name, text_column=data.text_column, text_pair_column=data.text_pair_column,
                              label_column=data.label_column or "label",
                              eval_fraction=DEFAULT_EVAL_FRACTION if data.eval_fraction is None else data.eval_fraction,
                              unit_column=data.unit_column)
    except InvalidDatasetError as err:
        problem = str(err)
        raise InvalidConfigError(lambda n: f"{n('data.name')} {problem}") from None


def load_splits(config: TrainingConfig, normalize: bool = True) -> tuple[Dataset, Dataset]:
    """Train and evaluation (``data.eval_split``) datasets: (input, label) tensors, or for ``minilm`` the
    dict items of a Hugging Face sequence classifier (:class:`~dpnoise.data.TokenizedText`); other text
    models get token ids."""
    from dpnoise.data import dataset_info, load_dataset

    data = config.data
    train_set = load_dataset(data.name, "train", data.root, limit=data.limit, normalize=normalize)
    test_set = load_dataset(data.name, data.eval_split, data.root, limit=data.test_limit, normalize=normalize)
    if dataset_info(data.name).modality == "text":
        from dpnoise.data import minilm_tokenizer, tokenize, tokenize_for_classifier

        tokenizer = minilm_tokenizer()
        encode = tokenize_for_classifier if config.model in TRAINABLE_MODELS else tokenize
        max_length = DEFAULT_MAX_LENGTH if data.max_length is None else data.max_length
        train_set = encode(train_set, max_length, tokenizer)
        test_set = encode(test_set, max_length, tokenizer)
    return train_set, test_set


def model_for_dataset(config: TrainingConfig) -> nn.Module:
    """``config.model`` sized for ``config.data`` (classes, channels, image side), with its trainable
    part (``trainable``, ``lora_rank``) where it has a choice."""
    from dpnoise.data import dataset_info
    from dpnoise.models import build_model

    info = dataset_info(config.data.name)
    image = info.modality == "image"
    options = {}
    if config.model in TRAINABLE_MODELS:
        options = {name: value for name, value in (("trainable", config.trainable), ("lora_rank", config.lora_rank))
                   if value is not None}
    if config.model in RESOLUTION_MODELS and config.resolution is not None:
        options["resolution"] = config.resolution
    return build_model(config.model, num_classes=info.num_classes,
                       in_channels=info.input_shape[0] if image else None,
                       input_size=info.input_shape[-1] if image else None, **options)


def batch_collation(dataset: Dataset) -> dict:
    """The ``DataLoader`` options of ``dataset``'s batches: its own collate function where it has one
    (:class:`~dpnoise.data.TokenizedText` crops the padding of each batch)."""
    from dpnoise.data import TokenizedText

    return {"collate_fn": TokenizedText.collate} if isinstance(getattr(dataset, "dataset", dataset), TokenizedText) else {}


def frozen_features(model: FeatureClassifier, config: TrainingConfig) -> tuple[Dataset, Dataset]:
    """Train and test features of ``model``'s frozen encoder (computed once, then read from the cache)."""
    from dpnoise.models import extract_features

    train_inputs, test_inputs = load_splits(config, normalize=False)
    return extract_features(model, train_inputs), extract_features(model, test_inputs)


def prepare_model_and_data(config: TrainingConfig) -> tuple[nn.Module, Dataset, Dataset]:
    """The trainable model sized for the dataset, with its train and test data.

    For the ``*-features`` models the frozen public encoder (ImageNet EfficientNet-Lite0 with
    BatchNorm in eval mode, or MiniLM-L6 sentence embeddings) maps each example to features once,
    and only the linear head is trained privately.  Everything is on the CPU (``make_private``
    moves the model to the run's device).
    """
    from dpnoise.models import FeatureClassifier

    model = model_for_dataset(config)
    if not isinstance(model, FeatureClassifier):
        return (model, *load_splits(config, normalize=config.model not in UNIT_PIXEL_MODELS))
    return (model.head, *frozen_features(model, config))


def standardize_features(config: TrainingConfig, head: nn.Module, train_set: Dataset) -> tuple[DpEvent, ...]:
    """With ``data.feature_statistics_noise``: replace ``head.norm`` by a standardisation with per-channel
    statistics of the training features released with that Gaussian noise, and return the release's DP
    event (for ``make_private(data_releases=...)``); otherwise change nothing and return ().

    The noise is drawn from a generator of its own, seeded like the run's private randomness
    (:mod:`dpnoise.training.randomness`: secret, or from ``config.noise_seed``); every rank of a
    distributed run takes rank 0's seed, so that all compute the same statistics.  A resumed run
    draws them again and discards them: the checkpoint's model holds the released ones.
    """
    import torch

    from dpnoise.mechanisms.channel_statistics import ChannelStandardization, private_channel_statistics
    from dpnoise.training.distributed import current_group
    from dpnoise.training.randomness import private_master_seed

    sigma = config.data.feature_statistics_noise
    if sigma is None:
        return ()
    seed = private_master_seed(config.noise_seed)
    group = current_group(torch.device("cpu"))
    if group is not None:
        seed = group.gather_objects(seed, "sharing the statistics' noise seed")[0]
    generator = torch.Generator().manual_seed((seed + STATISTICS_SEED_OFFSET) % 2**63)
    statistics = private_channel_statistics(train_set.tensors[0], sigma, generator)
    head.norm = ChannelStandardization(statistics.mean, statistics.variance)
    return (statistics.event,)


def build_optimizer(config: TrainingConfig, model: nn.Module) -> torch.optim.Optimizer:
    """``config.optimizer`` over ``model``'s trainable parameters."""
    import torch

    opt = config.optimizer
    lr = opt.lr if opt.lr is not None else DEFAULT_LR[opt.name]
    trainable = [p for p in model.parameters() if p.requires_grad]
    if opt.name == "adam":
        return torch.optim.Adam(trainable, lr=lr, weight_decay=opt.weight_decay)
    return torch.optim.SGD(trainable, lr=lr, momentum=opt.momentum, weight_decay=opt.weight_decay)


def apply_dirichlet_learning_rate(config: TrainingConfig, optimizer: torch.optim.Optimizer,
                                  engine: PrivacyEngine) -> None:
    """With ``effective_lr``: lr = effective lr / kappa(0.9; r, alpha) (docs/theory/dirichlet.md §4)."""
    from dpnoise.mechanisms import dirichlet_learning_rate

    if config.optimizer.effective_lr is None:
        return
    lr = dirichlet_learning_rate(config.optimizer.effective_lr, engine.setup.noise, engine.setup.options["alpha"])
    for group in optimizer.param_groups:
        group["lr"] = lr
