"""The experiments of the two papers as lists of :class:`RunSpec`, and the numbers the papers publish.

* ``table2`` -- the Lap2 paper's Table II with its Table I settings (CNN, q = 258/60000 = 0.0043,
  C = 1, delta = 1e-5, lr 1e-3, label smoothing 0.15, weight decay 1e-4, T = 5860). The paper does
  not name its optimizer; Adam is used (stated in every record).
* ``dirichlet`` -- the Dirichlet-mechanism paper: Dirichlet vs DP-SGD (Gaussian) vs penultimate-layer Gaussian at
  eps in {1, 2, 4, 8} (reduced epochs, stated in the records; CIFAR-10 on a half-width GroupNorm ResNet).
* ``dirichlet-alpha`` -- the Dirichlet-mechanism paper's Fig. 2, reduced: alpha x effective learning rate at eps = 1 (SGD).
* ``finetune`` -- the Lap2 paper's fine-tuning stand-ins: a linear head on frozen EfficientNet-Lite0
  features (CIFAR-10 JPEG copy) and on frozen MiniLM-L6 sentence embeddings (SST-2), sized to the
  CPU budget.
* ``finetune-full`` -- the Lap2 paper's Tables III and II (ViT column) at full dimension, reduced: MiniLM-L6 on
  SST-2 (22.7M parameters) and EfficientNet-Lite0 on CIFAR-10 (3.38M) with every parameter trained,
  hyper-parameters fixed in advance after Li et al. (arXiv 2110.05679), scaled to a CPU core (batch, sequence
  length, image side, training subset and steps reduced, stated in FINETUNE_FULL_TASKS and every record).
* ``scatternet`` -- Tramèr & Boneh's recipe (``dpnoise train --recipe scatternet``, fixed in advance
  from their published hyper-parameters) for every mechanism: Gaussian at epsilon 3 on every
  dataset and head, and Gaussian, Lap2, Laplace-L1 and Dirichlet at epsilon 1, 2, 3 with the linear
  head on MNIST and Fashion-MNIST, each calibrated by the mechanism's sound default accountant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from reproductions.records import RunSpec

#: The Lap2 paper's Table I (MNIST / Fashion-MNIST rows): batch 258 of 60,000 gives q = 0.0043 exactly.
TABLE2_SETTINGS = dict(model="cnn", steps=5860, batch_size=258, delta=1e-5, clip=1.0, optimizer="adam",
                       lr=1e-3, weight_decay=1e-4, label_smoothing=0.15)
TABLE2_EPSILONS = (3.42, 2.53, 1.68, 0.88, 0.13)
TABLE2_DATASETS = ("fashion-mnist", "mnist")


@dataclass(frozen=True)
class Column:
    """A column of a results table: a mechanism and the accountant that calibrated its noise."""

    label: str
    mechanism: str
    calibrated_with: str


TABLE2_COLUMNS = (
    Column("Gaussian (RDP)", "gaussian", "gaussian-rdp"),
    Column("Laplace-L1 (RDP)", "laplace-l1", "laplace-l1-rdp"),
    Column("Lap2 (b from lap2-paper)", "lap2", "lap2-paper"),
    Column("Lap2 (b from sound lap2-rdp)", "lap2", "lap2-rdp"),
    Column("Gaussian (PLD)", "gaussian", "gaussian"),
    Column("Laplace-L1 (PLD)", "laplace-l1", "laplace-l1"),
)

#: Table II comparisons the findings rest on, each (first, second): accuracy of first minus second.
TABLE2_COMPARISONS: tuple[tuple[Column, Column], ...] = (
    (TABLE2_COLUMNS[0], TABLE2_COLUMNS[3]),  # Gaussian vs Lap2 at equal (sound) epsilon
    (TABLE2_COLUMNS[3], TABLE2_COLUMNS[2]),  # what the sound calibration changes for Lap2
    (TABLE2_COLUMNS[3], TABLE2_COLUMNS[1]),  # L2 vs L1 clipping under Laplace noise
    (TABLE2_COLUMNS[4], TABLE2_COLUMNS[0]),  # what PLD accounting buys Gaussian DP-SGD
    (TABLE2_COLUMNS[5], TABLE2_COLUMNS[1]),  # what PLD accounting buys Laplace-L1
)

#: The Lap2 paper's Table II, test accuracy in percent at TABLE2_EPSILONS (its Lap2 column used
#: the paper's accountant).
TABLE2_PUBLISHED: dict[str, dict[str, tuple[float, ...]]] = {
    "mnist": {
        "gaussian-rdp": (97.27, 97.19, 97.42, 96.08, 87.44),
        "laplace-l1-rdp": (51.82, 46.67, 28.82, 16.44, 10.40),
        "lap2-paper": (96.82, 96.90, 95.39, 93.29, 78.96),
    },
    "fashion-mnist": {
        "gaussian-rdp": (83.67, 83.09, 82.34, 80.34, 72.58),
        "laplace-l1-rdp": (55.05, 43.85, 43.94, 28.22, 14.74),
        "lap2-paper": (82.60, 81.45, 81.45, 77.03, 70.03),
    },
}

#: The Dirichlet-mechanism paper's comparison: reduced to a few epochs on the 2-core budget.
DIRICHLET_SETTINGS = dict(model="cnn", steps=704, batch_size=256, delta=1e-5, clip=1.0, optimizer="adam",
                          lr=1e-3, weight_decay=0.0, label_smoothing=0.0)
DIRICHLET_EPSILONS = (1.0, 2.0, 4.0, 8.0)
DIRICHLET_DATASETS = ("mnist", "fashion-mnist", "cifar10-jpeg")
#: CIFAR-10 runs a GroupNorm ResNet at half width for 2 epochs: one step of the full-width one takes
#: 2-5 s on a CPU core (10 with per-example gradients), which the session budget cannot hold.
DIRICHLET_DATASET_SETTINGS = {"cifar10-jpeg": dict(model="resnet-gn-small", steps=391)}
DIRICHLET_ALPHA = 1.0
DIRICHLET_COLUMNS = (
    Column("Dirichlet (alpha=1, Ponnoprat RDP) †", "dirichlet", "dirichlet-ponnoprat"),
    Column("DP-SGD (Gaussian, RDP)", "gaussian", "gaussian-rdp"),
    Column("Penultimate Gaussian (reconstr., RDP) †", "penultimate-gaussian", "penultimate-gaussian-rdp"),
    Column("Dirichlet (alpha=1, exact base RDP) †", "dirichlet", "dirichlet-add-remove"),
)

#: The Dirichlet-mechanism paper's Fig. 2, reduced: SGD, eps = 1, alpha x effective learning rate on MNIST.
ALPHA_GRID_SETTINGS = dict(model="cnn", steps=470, batch_size=256, delta=1e-5, clip=1.0, optimizer="sgd",
                           weight_decay=0.0, label_smoothing=0.0)
ALPHA_GRID_ALPHAS = (0.3, 1.0, 3.0)
ALPHA_GRID_EFFECTIVE_LRS = (0.03, 0.1, 0.3, 1.0)
ALPHA_GRID_EPSILON = 1.0

#: The Dirichlet-mechanism paper's abstract (CIFAR10, delta = 1e-5; its ResNet-18, not our network): the only published numbers
#: recovered, by column. The penultimate-Gaussian entry is Monir & Ghinita's own figure as that paper quotes it.
DIRICHLET_PUBLISHED = {"cifar10-jpeg": {4.0: {"dirichlet-ponnoprat": 88.17, "penultimate-gaussian-rdp": 78.37},
                                        1.0: {"dirichlet-ponnoprat": 82.96}}}

#: The Lap2 paper's fine-tuning targets (ViT on CIFAR-10; RoBERTa-base on SST-2) and their stand-ins here.
FINETUNE_TASKS = {
    "cifar10-jpeg": dict(model="efficientnet-lite0-features", epsilons=(0.5, 0.75), steps=300, batch_size=256,
                         lr=1e-3),
    # A linear head on cached sentence embeddings costs milliseconds a step, so it gets 10 epochs
    # at batch 1024; fine-tuning MiniLM's last block (model `minilm`) takes ~3.6 s a step here.
    "sst2": dict(model="minilm-features", epsilons=(0.54, 0.91, 1.16, 3.74), steps=660, batch_size=1024, lr=2e-3),
}
FINETUNE_COLUMNS = (
    Column("Gaussian (RDP)", "gaussian", "gaussian-rdp"),
    Column("Lap2 (b from lap2-paper)", "lap2", "lap2-paper"),
    Column("Lap2 (b from sound lap2-rdp)", "lap2", "lap2-rdp"),
)
#: The Lap2 paper's Table II (ViT, CIFAR-10) and Table III (RoBERTa-base, SST-2), percent; Lap2 = paper-calibrated.
FINETUNE_PUBLISHED = {
    "cifar10-jpeg": {0.75: {"gaussian-rdp": 97.17, "laplace-l1-rdp": 53.58, "lap2-paper": 98.11},
                     0.5: {"gaussian-rdp": 96.90, "laplace-l1-rdp": 47.04, "lap2-paper": 98.18}},
    "sst2": {3.74: {"gaussian-rdp": 90.31, "laplace-l1-rdp": 50.34, "lap2-paper": 90.11},
             1.16: {"gaussian-rdp": 89.65, "laplace-l1-rdp": 50.21, "lap2-paper": 83.32},
             0.91: {"gaussian-rdp": 89.23, "laplace-l1-rdp": 50.15, "lap2-paper": 89.14},
             0.54: {"gaussian-rdp": 87.16, "laplace-l1-rdp": 48.97, "lap2-paper": 87.88}},
}

#: The Lap2 paper's Table III at full dimension: MiniLM-L6 (BERT, 22.7M parameters, all trained) on SST-2,
#: evaluated on GLUE's 872 dev sentences.  Fixed in advance after Li et al. (arXiv 2110.05679: Adam, lr 5e-4,
#: clipping norm 0.1, no weight decay, large batches, few epochs), scaled to one shared CPU core: batch 128
#: (q = 0.0019), sentences cut to 32 tokens, and 30 steps (6% of an epoch; a step takes 15-30 s here).
FINETUNE_FULL_STEPS = 30
FINETUNE_FULL_SETTINGS = dict(model="minilm", trainable="all", max_length=32, eval_split="dev",
                              steps=FINETUNE_FULL_STEPS, batch_size=128, delta=1e-5, clip=0.1, optimizer="adam",
                              lr=5e-4, weight_decay=0.0, label_smoothing=0.0)
#: the paper's epsilons, its first and last (3.74, 0.54) run first
FINETUNE_FULL_EPSILONS = (3.74, 0.54, 1.16, 0.91)
#: every mechanism calibrated by its sound default accountant, and Lap2 also by the paper's (not a bound)
FINETUNE_FULL_COLUMNS = (
    Column("Gaussian", "gaussian", "gaussian"),
    Column("Lap2 (b from sound lap2)", "lap2", "lap2"),
    Column("Lap2 (b from lap2-paper)", "lap2", "lap2-paper"),
    Column("Laplace-L1", "laplace-l1", "laplace-l1"),
)
#: The Lap2 paper's Table II ViT column at full dimension: EfficientNet-Lite0 (ImageNet weights, a new 10-class
#: head, 3.38M parameters, all trained; BatchNorm frozen at its ImageNet statistics) on the CIFAR-10 JPEG copy.
#: The paper's sampling rate q = 0.01668 on a class-balanced subset of 10,000 training images (batch 167),
#: images resized to 64 px (the paper's ViT: 224), 60 steps (the paper: 900; a step of 167 images takes about
#: 20 s on a shared core), evaluated on 2,000 test images.  The optimiser settings are the MiniLM runs' (Li et
#: al.), fixed in advance, not tuned.
FINETUNE_FULL_IMAGE_SETTINGS = dict(model="efficientnet-lite0", resolution=64, train_limit=10_000, test_limit=2_000,
                                    steps=60, batch_size=167, physical_batch_size=64, delta=1e-5, clip=0.1,
                                    optimizer="adam", lr=5e-4, weight_decay=0.0, label_smoothing=0.0)
#: dataset -> (its settings, its epsilons in run order): the paper's Table III epsilons for SST-2, its Table II
#: fine-tuning epsilons for CIFAR-10
FINETUNE_FULL_TASKS = {"sst2": (FINETUNE_FULL_SETTINGS, FINETUNE_FULL_EPSILONS),
                       "cifar10-jpeg": (FINETUNE_FULL_IMAGE_SETTINGS, (0.75, 0.5))}
#: the paper's Tables III (RoBERTa-base) and II (ViT) as {dataset: {eps: {column's calibrated_with: accuracy}}}:
#: its Gaussian and Laplace-L1 columns were accounted by RDP, set beside ours accounted by the sound defaults
FINETUNE_FULL_PUBLISHED = {dataset: {eps: {"gaussian": cells["gaussian-rdp"], "laplace-l1": cells["laplace-l1-rdp"],
                                           "lap2-paper": cells["lap2-paper"]}
                                     for eps, cells in FINETUNE_PUBLISHED[dataset].items()}
                           for dataset in FINETUNE_FULL_TASKS}

#: Tramèr & Boneh (arXiv 2011.11660), ScatterNet at (3, 1e-5), percent: (dataset, model) -> accuracy.
SCATTERNET_PUBLISHED = {("mnist", "scatternet-linear"): 98.7, ("mnist", "scatternet-cnn"): 98.7,
                        ("fashion-mnist", "scatternet-linear"): 89.7, ("fashion-mnist", "scatternet-cnn"): 89.0,
                        ("cifar10-jpeg", "scatternet-linear"): 67.0, ("cifar10-jpeg", "scatternet-cnn"): 69.3}
SCATTERNET_DATASETS = ("fashion-mnist", "mnist", "cifar10-jpeg")
#: every mechanism, calibrated and accounted by its sound default accountant, except the Dirichlet
#: mechanism's runs, calibrated by the add/remove reading (flagged unsound; its records carry their lower bound)
SCATTERNET_COLUMNS = (
    Column("Gaussian", "gaussian", "gaussian"),
    Column("Lap2", "lap2", "lap2"),
    Column("Laplace-L1", "laplace-l1", "laplace-l1"),
    Column("Dirichlet (alpha=1) †", "dirichlet", "dirichlet-add-remove"),
)
SCATTERNET_EPSILONS = (1.0, 2.0, 3.0)
#: the mechanism comparison runs on these datasets with the linear head; Gaussian at epsilon 3 on all
SCATTERNET_COMPARISON_DATASETS = ("fashion-mnist", "mnist")

#: Clipping rules compared against flat clipping (adaptive with its defaults: target quantile 0.5, clipping_lr
#: 0.2, count noise B / 20) for the Gaussian and the sound Lap2 mechanism.
CLIPPING_RULES = ("automatic", "adaptive")


@dataclass(frozen=True)
class ClippingTask:
    """One model's clipping comparison: the flat rule's runs are ``flat_experiment``'s own records with the same
    settings, steps and seeds."""
    settings: dict
    epsilons: tuple[float, ...]
    columns: tuple[Column, ...]
    flat_experiment: str
    model_label: str


#: dataset -> its task: Table II's CNN on Fashion-MNIST, and MiniLM-L6 fully fine-tuned on SST-2 at T = 300 (the
#: finetune-full runs' three-seed setting)
CLIPPING_TASKS = {
    "fashion-mnist": ClippingTask(TABLE2_SETTINGS, (0.88,), (TABLE2_COLUMNS[0], TABLE2_COLUMNS[3]), "table2",
                                  "Table II's CNN"),
    "sst2": ClippingTask({**FINETUNE_FULL_SETTINGS, "steps": 300}, (3.74,), FINETUNE_FULL_COLUMNS[:2],
                         "finetune-full", "MiniLM-L6, every parameter trained"),
}
CLIPPING_DATASETS = ("fashion-mnist",)

EXPERIMENTS = ("table2", "finetune", "finetune-full", "dirichlet", "scatternet", "clipping", "figures")
#: the folders of the results directory that hold records (every RunSpec.experiment); the others, such as the
#: git-ignored logs/ where runs in progress write, are never read as records
RECORD_FOLDERS = ("table2", "dirichlet", "dirichlet-alpha", "finetune", "finetune-full", "scatternet", "clipping")


def grid(experiment: str, datasets: Sequence[str], epsilons: Sequence[float], seeds: Sequence[int],
         columns: Sequence[Column], settings: dict, **fixed: object) -> list[RunSpec]:
    """Specs in run order: seed, then dataset, then epsilon, then column."""
    return [
        RunSpec(experiment=experiment, dataset=d, mechanism=c.mechanism, calibrated_with=c.calibrated_with,
                target_epsilon=e, seed=s, **settings, **fixed)
        for s in seeds for d in datasets for e in epsilons for c in columns
    ]


def with_alpha(spec: RunSpec, alpha: float) -> RunSpec:
    """``spec`` with the Dirichlet offset set when the mechanism is Dirichlet."""
    return replace(spec, alpha=alpha) if spec.mechanism == "dirichlet" else spec


def table2_specs(datasets: Sequence[str], epsilons: Sequence[float], seeds: Sequence[int],
                 steps: Optional[int] = None) -> list[RunSpec]:
    """The Lap2 paper's Table II runs (``steps`` overrides T = 5860; the record states it)."""
    settings = {**TABLE2_SETTINGS, **({"steps": steps} if steps else {})}
    return grid("table2", datasets, epsilons, seeds, TABLE2_COLUMNS, settings)


def clipping_specs(datasets: Sequence[str], epsilons: Optional[Sequence[float]], seeds: Sequence[int],
                   steps: Optional[int] = None) -> list[RunSpec]:
    """Each dataset's CLIPPING_TASKS runs (at ``epsilons`` or its own) with each of CLIPPING_RULES instead of
    flat clipping; in run order: dataset, seed, epsilon, column, rule."""
    specs = []
    for dataset in datasets:
        task = CLIPPING_TASKS[dataset]
        settings = {**task.settings, **({"steps": steps} if steps else {})}
        specs += [replace(spec, clipping=rule)
                  for spec in grid("clipping", [dataset], epsilons or task.epsilons, seeds, task.columns, settings)
                  for rule in CLIPPING_RULES]
    return specs


def dirichlet_specs(datasets: Sequence[str], epsilons: Sequence[float], seeds: Sequence[int],
                    steps: Optional[int] = None) -> list[RunSpec]:
    """The Dirichlet-mechanism paper's comparison runs (Dirichlet with alpha = DIRICHLET_ALPHA)."""
    specs = []
    for dataset in datasets:
        settings = {**DIRICHLET_SETTINGS, **DIRICHLET_DATASET_SETTINGS.get(dataset, {}),
                    **({"steps": steps} if steps else {})}
        specs += grid("dirichlet", [dataset], epsilons, seeds, DIRICHLET_COLUMNS, settings)
    return [with_alpha(s, DIRICHLET_ALPHA) for s in sorted(specs, key=lambda s: s.seed)]


def alpha_grid_specs(dataset: str, seeds: Sequence[int], steps: Optional[int] = None) -> list[RunSpec]:
    """The Dirichlet-mechanism paper's Fig. 2 (reduced): Dirichlet at eps = 1 for each alpha and effective learning rate."""
    settings = {**ALPHA_GRID_SETTINGS, **({"steps": steps} if steps else {})}
    return [
        RunSpec(experiment="dirichlet-alpha", dataset=dataset, mechanism="dirichlet", calibrated_with="dirichlet-ponnoprat",
                target_epsilon=ALPHA_GRID_EPSILON, seed=s, alpha=a, effective_lr=lr, **settings)
        for s in seeds for a in ALPHA_GRID_ALPHAS for lr in ALPHA_GRID_EFFECTIVE_LRS
    ]


def finetune_specs(datasets: Sequence[str], epsilons: Optional[Sequence[float]], seeds: Sequence[int],
                   steps: Optional[int] = None, quick: bool = False) -> list[RunSpec]:
    """Fine-tuning stand-ins, each task at ``epsilons`` or its own (``quick``: its first and last)."""
    specs = []
    for dataset in datasets:
        task = dict(FINETUNE_TASKS[dataset])
        own = task.pop("epsilons")
        task_epsilons = epsilons or ((own[0], own[-1]) if quick else own)
        settings = dict(delta=1e-5, clip=1.0, optimizer="adam", weight_decay=0.0, label_smoothing=0.0, **task)
        if steps:
            settings["steps"] = steps
        specs += grid("finetune", [dataset], task_epsilons, seeds, FINETUNE_COLUMNS, settings)
    return specs


def finetune_full_specs(datasets: Sequence[str], epsilons: Optional[Sequence[float]], seeds: Sequence[int],
                        steps: Optional[int] = None, quick: bool = False) -> list[RunSpec]:
    """Full fine-tuning (FINETUNE_FULL_TASKS) of each dataset's model at ``epsilons`` or its own (``quick``:
    its first two); ``steps`` overrides the planned steps.  In run order: dataset, seed, epsilon in the order
    given, column."""
    specs = []
    for dataset in datasets:
        settings, own = FINETUNE_FULL_TASKS[dataset]
        settings = {**settings, **({"steps": steps} if steps else {})}
        specs += grid("finetune-full", [dataset], epsilons or (own[:2] if quick else own), seeds,
                      FINETUNE_FULL_COLUMNS, settings)
    return specs


def scatternet_spec(dataset: str, model: str, column: Column, epsilon: float, seed: int,
                    steps: Optional[int] = None) -> RunSpec:
    """One run of the ``scatternet`` recipe (dpnoise.training.recipes) for ``column``'s mechanism.

    The recipe's epochs become T = ceil(E / q) steps.  The Dirichlet mechanism clips nothing, so it
    gets the Gaussian runs' largest step instead of their learning rate: lr x C (fixed in advance,
    not tuned), with alpha = 1.
    """
    import math

    from dpnoise.data import dataset_info
    from dpnoise.training.recipes import RECIPES

    fields = RECIPES["scatternet"].fields(dataset, model)
    batch_size, lr, clip = fields["schedule.batch_size"], fields["optimizer.lr"], fields["privacy.max_grad_norm"]
    planned = math.ceil(fields["privacy.epochs"] * dataset_info(dataset).train_size / batch_size)
    spec = RunSpec(
        experiment="scatternet", dataset=dataset, model=model, mechanism=column.mechanism,
        calibrated_with=column.calibrated_with, target_epsilon=epsilon, seed=seed, steps=steps or planned,
        batch_size=batch_size, delta=fields["privacy.delta"], clip=clip, optimizer=fields["optimizer.name"],
        lr=lr * clip if column.mechanism == "dirichlet" else lr, momentum=fields["optimizer.momentum"],
        physical_batch_size=fields["execution.max_physical_batch_size"],
    )
    return with_alpha(spec, 1.0)


def scatternet_specs(datasets: Sequence[str], epsilons: Sequence[float], seeds: Sequence[int],
                     steps: Optional[int] = None) -> list[RunSpec]:
    """Gaussian at epsilon 3 with both heads on ``datasets``; every mechanism with the linear head at
    ``epsilons`` on the comparison datasets among them.  The linear-head runs of every seed come
    first (minutes each), then the CNN heads (per-example gradients of convolutions: much longer)."""
    linear, cnn = [], []
    for seed in seeds:
        for dataset in datasets:
            linear.append(scatternet_spec(dataset, "scatternet-linear", SCATTERNET_COLUMNS[0], 3.0, seed, steps))
            cnn.append(scatternet_spec(dataset, "scatternet-cnn", SCATTERNET_COLUMNS[0], 3.0, seed, steps))
        for dataset in (d for d in datasets if d in SCATTERNET_COMPARISON_DATASETS):
            for epsilon in epsilons:
                for column in SCATTERNET_COLUMNS:
                    if not (column.mechanism == "gaussian" and epsilon == 3.0):
                        linear.append(scatternet_spec(dataset, "scatternet-linear", column, epsilon, seed, steps))
    return linear + cnn
