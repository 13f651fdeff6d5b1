"""Markdown tables of aggregated results, next to the numbers the papers publish.

The detailed tables (one line per configuration, with noise, epsilons, commits and commands) and
the compact summaries of the results pages (``*_summary_markdown``: one cell per configuration,
mean ± std over seeds with their number n) are both built from the aggregated records only."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from dpnoise.accounting import ACCOUNTANTS, OUTPUT_PRIVACY_SCOPE, get_mechanism_spec
from dpnoise.formatting import significant_digits
from reproductions.plans import (
    ALPHA_GRID_ALPHAS,
    CLIPPING_RULES,
    CLIPPING_TASKS,
    DIRICHLET_COLUMNS,
    DIRICHLET_PUBLISHED,
    FINETUNE_COLUMNS,
    FINETUNE_FULL_COLUMNS,
    FINETUNE_FULL_PUBLISHED,
    FINETUNE_FULL_TASKS,
    FINETUNE_PUBLISHED,
    SCATTERNET_COLUMNS,
    SCATTERNET_COMPARISON_DATASETS,
    SCATTERNET_DATASETS,
    SCATTERNET_EPSILONS,
    SCATTERNET_PUBLISHED,
    TABLE2_COLUMNS,
    TABLE2_COMPARISONS,
    TABLE2_EPSILONS,
    TABLE2_PUBLISHED,
    TABLE2_SETTINGS,
    Column,
)
from reproductions.records import GROUP_KEYS, PairedDifference, group_value, format_accuracy, paired_difference

Row = dict[str, Any]


def find_row(rows: Sequence[Row], **match: Any) -> Optional[Row]:
    """The first aggregated row whose fields equal ``match`` (None: not run)."""
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def find_column_row(rows: Sequence[Row], dataset: str, eps: float, column: Column) -> Optional[Row]:
    """The aggregated row of ``column`` on ``dataset`` at target ``eps`` (None: not run)."""
    return find_row(rows, dataset=dataset, target_epsilon=eps, mechanism=column.mechanism,
                    calibrated_with=column.calibrated_with)


def upper_bound_text(epsilon: float) -> str:
    """An accountant's epsilon to 3 significant digits, rounded up: never printed below its bound."""
    return significant_digits(epsilon, 3, "up")


def lower_bound_text(epsilon: float) -> str:
    """A lower bound on the true epsilon to 3 significant digits, rounded down: never printed above it."""
    return significant_digits(epsilon, 3, "down")


def accountant_epsilons_text(epsilon_by_accountant: dict[str, float]) -> str:
    """``lap2 0.88, lap2-paper* 1.51``: each accountant's epsilon rounded up, * marking one that is
    not a valid bound."""
    return ", ".join(f"{name}{'' if ACCOUNTANTS[name].sound else '*'} {upper_bound_text(eps)}"
                     for name, eps in epsilon_by_accountant.items())


def format_epsilons(row: Optional[Row]) -> str:
    """``lap2 0.88, lap2-paper* 1.51`` (* marks an accountant that is not a valid bound), and for a
    run calibrated by such an accountant the exact lower bound on its true epsilon, in bold when it
    refutes the claimed target."""
    if row is None or row["status"] != "ok":
        return "—"
    text = accountant_epsilons_text(row["epsilon_by_accountant"])
    lower = row.get("lower_bound_epsilon")
    if lower is None:
        return text
    bound = f"true ε ≥ {lower_bound_text(lower)}"
    return f"{text}; **{bound}: claim refuted**" if lower > row["target_epsilon"] else f"{text}; {bound}"


def noise_text(mechanism: str, noise: float, digits: int) -> str:
    """A calibrated noise rounded toward more privacy (sigma and b up, r down): a value read off a table
    and trained with never gives more than the epsilon it was calibrated to."""
    return get_mechanism_spec(mechanism).noise.printed(noise, digits)


def format_noise(row: Optional[Row]) -> str:
    if row is None or row["status"] != "ok":
        return "—"
    return noise_text(row["mechanism"], row["noise"], 4)


def format_steps(row: Optional[Row]) -> str:
    if row is None or row["status"] != "ok":
        return "—"
    return "/".join(str(s) for s in row["steps"]) + f" of {row['steps_planned']}"


def markdown(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def long_table(rows: Sequence[Row], dataset: str, epsilons: Sequence[float], columns: Sequence[Column],
               published: dict[float, dict[str, float]]) -> str:
    """One line per (epsilon, column): noise, steps, epsilon under every accountant, ours vs published.

    ``published[eps][calibrated_with]`` is the paper's accuracy in percent for that column.
    """
    body, commands = [], []
    for eps in epsilons:
        for column in columns:
            row = find_column_row(rows, dataset, eps, column)
            if row is None:
                continue
            paper = published.get(eps, {}).get(column.calibrated_with)
            body.append([f"{eps:g}", column.label, format_noise(row), format_steps(row), format_epsilons(row),
                         format_accuracy(row), "—" if paper is None else f"{paper:.2f}",
                         " ".join(row.get("git_commits", []))])
            commands += [f"    {c}" for c in row.get("commands", [])]
    if not body:
        return "(no runs yet)"
    header = ["target ε", "column", "noise", "steps", "ε by accountant (δ=1e-5)", "ours: accuracy %", "paper's %",
              "commit"]
    return "\n".join([markdown(header, body), "", "<details><summary>exact commands (one per seed)</summary>", "",
                      *commands, "", "</details>"])


def table2_published(dataset: str) -> dict[float, dict[str, float]]:
    """The Lap2 paper's Table II for ``dataset`` as {eps: {calibrated_with: accuracy}}."""
    columns = TABLE2_PUBLISHED[dataset]
    return {eps: {name: values[i] for name, values in columns.items()} for i, eps in enumerate(TABLE2_EPSILONS)}


def table2_markdown(rows: Sequence[Row], datasets: Sequence[str]) -> str:
    """The Lap2 paper's Table II, ours next to the published numbers, one table per dataset."""
    parts = []
    for dataset in datasets:
        parts += [f"### {dataset}", "", long_table(rows, dataset, TABLE2_EPSILONS, TABLE2_COLUMNS,
                                                   table2_published(dataset)), ""]
    return "\n".join(parts)


def format_paired_difference(difference: Optional[PairedDifference]) -> str:
    """``+1.47 ± 0.20 (ahead in 3 of 3 seeds)`` in accuracy points, or ``—`` (no common seed)."""
    if difference is None:
        return "—"
    spread = "" if difference.std is None else f" ± {100 * difference.std:.2f}"
    return f"{100 * difference.mean:+.2f}{spread} (ahead in {difference.positive} of {difference.n} seeds)"


def format_paired_rows(first: Optional[Row], second: Optional[Row]) -> str:
    """:func:`format_paired_difference` of two aggregated rows (``—`` when either was not run)."""
    return "—" if first is None or second is None else format_paired_difference(paired_difference(first, second))


def paired_differences_markdown(rows: Sequence[Row], datasets: Sequence[str],
                                comparisons: Sequence[tuple[Column, Column]] = TABLE2_COMPARISONS,
                                epsilons: Sequence[float] = TABLE2_EPSILONS) -> str:
    """Per (dataset, epsilon): accuracy of one column minus another's, paired by seed, with the
    number of seeds in which the first column is ahead."""

    body = []
    for dataset in datasets:
        for eps in epsilons:
            cells = [format_paired_rows(find_column_row(rows, dataset, eps, first),
                                        find_column_row(rows, dataset, eps, second)) for first, second in comparisons]
            if any(cell != "—" for cell in cells):
                body.append([dataset, f"{eps:g}", *cells])
    if not body:
        return "(no runs yet)"
    header = ["dataset", "target ε", *[f"{first.label} − {second.label}" for first, second in comparisons]]
    return markdown(header, body)


def dirichlet_markdown(rows: Sequence[Row], datasets: Sequence[str], epsilons: Sequence[float]) -> str:
    """The Dirichlet-mechanism paper's comparison; unreachable targets are listed with the calibrator's reason."""
    parts = []
    for dataset in datasets:
        published = DIRICHLET_PUBLISHED.get(dataset, {})
        parts += [f"### {dataset}", "", long_table(rows, dataset, epsilons, DIRICHLET_COLUMNS, published), ""]
    unreachable = [r for r in rows if r["status"] == "unreachable"]
    parts += [f"- unreachable: {r['dataset']} {r['mechanism']} ε={r['target_epsilon']:g}: {r['reason']}"
              for r in unreachable]
    parts.append(f"\n† Dirichlet and penultimate-Gaussian rows. {OUTPUT_PRIVACY_SCOPE}")
    cifar = DIRICHLET_PUBLISHED["cifar10-jpeg"]
    parts.append(f"\nThe Dirichlet-mechanism paper publishes CIFAR-10 only (ResNet-18, full training): Dirichlet {cifar[4.0]['dirichlet-ponnoprat']}% "
                 f"at ε=4 and {cifar[1.0]['dirichlet-ponnoprat']}% at ε=1; Monir & Ghinita (penultimate layer) "
                 f"{cifar[4.0]['penultimate-gaussian-rdp']}% at ε=4.")
    return "\n".join(parts)


def alpha_grid_markdown(rows: Sequence[Row], scope_note: bool = True) -> str:
    """The Dirichlet-mechanism paper's Fig. 2 (reduced): accuracy per alpha (rows) and effective learning
    rate (columns), each row with the scope of its epsilon unless ``scope_note`` is false."""
    lrs = sorted({r["effective_lr"] for r in rows})
    body = []
    for alpha in ALPHA_GRID_ALPHAS:
        row_r = find_row(rows, alpha=alpha)
        if row_r is None:
            continue
        cells = [format_accuracy(find_row(rows, alpha=alpha, effective_lr=lr)) for lr in lrs]
        body.append([f"{alpha:g}", format_noise(row_r), *cells])
    header = ["alpha", "r* (ε=1)", *[f"γ_eff={lr:g}" for lr in lrs]]
    if not body:
        return "(no runs yet)"
    return markdown(header, body) + (f"\n\nEvery row: {OUTPUT_PRIVACY_SCOPE}" if scope_note else "")


def finetune_markdown(rows: Sequence[Row], datasets: Sequence[str]) -> str:
    """Fine-tuning stand-ins next to the Lap2 paper's ViT / RoBERTa numbers (different models!)."""
    parts = []
    for dataset in datasets:
        published = FINETUNE_PUBLISHED[dataset]
        epsilons = sorted({r["target_epsilon"] for r in rows if r["dataset"] == dataset}, reverse=True)
        parts += [f"### {dataset}", "", long_table(rows, dataset, epsilons, FINETUNE_COLUMNS, published), ""]
    return "\n".join(parts)


def table2_noise_markdown(epsilons: Sequence[float] = TABLE2_EPSILONS) -> str:
    """Accounting only: the noise each Table II column is calibrated to, and its epsilon under every
    accountant that applies (the Lap2 paper's MNIST/FMNIST setting: q = 0.0043, T = 5860, C = 1, n = 26,010)."""
    import warnings

    from dpnoise.accounting import UnsoundAccountantWarning, calibrate_noise
    from reproductions.plans import TABLE2_SETTINGS as S

    body = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsoundAccountantWarning)
        for eps in epsilons:
            for column in TABLE2_COLUMNS:
                result = calibrate_noise(column.calibrated_with, eps, S["delta"], S["batch_size"] / 60_000,
                                         S["steps"], clip=S["clip"], params=26_010)
                eps_text = accountant_epsilons_text(result.epsilon_by_accountant)
                body.append([f"{eps:g}", column.label, noise_text(result.mechanism, result.noise, 4), eps_text])
    return markdown(["target ε", "column", "calibrated noise (σ, or b at C=1)", "ε by accountant (δ=1e-5)"], body)


#: The Lap2 paper's Fig. 8 accuracy targets (percent) per dataset.
CONVERGENCE_TARGETS = {"fashion-mnist": (80.0, 82.0), "mnist": (95.0,)}


def first_step_reaching(curve: Sequence[dict[str, Any]], target_percent: float) -> Optional[int]:
    """First evaluated step whose test accuracy is at least ``target_percent`` (None: never)."""
    return next((p["step"] for p in curve if 100 * p["test_accuracy"] >= target_percent), None)


def convergence_markdown(records: Sequence[dict[str, Any]], dataset: str, columns: Sequence[Column]) -> str:
    """The Lap2 paper's Fig. 8 as numbers: steps until the test accuracy first reaches each target, per run.

    Accuracy is evaluated once per epoch (every ~1/q steps), so the steps are rounded up to that.
    """
    targets = CONVERGENCE_TARGETS.get(dataset, ())
    body = []
    for record in sorted((r for r in records if r["dataset"] == dataset and r["status"] == "ok"),
                         key=lambda r: (-r["target_epsilon"], r["seed"])):
        label = next(c.label for c in columns
                     if (c.mechanism, c.calibrated_with) == (record["mechanism"], record["calibrated_with"]))
        steps = [first_step_reaching(record["curve"], t) for t in targets]
        body.append([f"{record['target_epsilon']:g}", label, str(record["seed"]),
                     *["never" if s is None else str(s) for s in steps]])
    if not body:
        return "(no runs yet)"
    return markdown(["target ε", "column", "seed", *[f"steps to {t:g}%" for t in targets]], body)


# --- Compact summaries for the results pages (docs/results/) -----------------------------------------------------
# One table per dataset: a line per column (mechanism and calibrating accountant), a cell per target epsilon, the
# paper's published number on the line below ours, and, where a column is re-run under a tighter accountant, the
# accuracy gained (paired by seed).  "—": not run (or not published).

#: How the summaries name the datasets.
DATASET_NAMES = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST", "cifar10-jpeg": "CIFAR-10 (JPEG q75 copy)", "sst2": "SST-2"}
PAPER_LINE = "↳ paper"
TRUE_EPSILON_LINE = "↳ its true ε"


def column_named(columns: Sequence[Column], calibrated_with: str) -> Column:
    """The column of ``columns`` calibrated by ``calibrated_with``."""
    return next(c for c in columns if c.calibrated_with == calibrated_with)


def column_title(column: Column) -> str:
    """The column's label, with * when its calibrating accountant is not a valid bound."""
    return column.label + ("" if ACCOUNTANTS[column.calibrated_with].sound else " *")


def format_gain(first: Optional[Row], second: Optional[Row], noise_name: str = "noise") -> str:
    """Accuracy of ``first`` minus ``second`` in points, paired by seed, and the relative change of the
    calibrated noise parameter: ``+0.33 ± 0.01 (2/2 seeds ahead); noise −4.8%``."""
    if first is None or second is None:
        return "—"
    difference = paired_difference(first, second)
    if difference is None:
        return "—"
    spread = "" if difference.std is None else f" ± {100 * difference.std:.2f}"
    text = f"{100 * difference.mean:+.2f}{spread} ({difference.positive}/{difference.n} seeds ahead)"
    change = f"{100 * (first['noise'] / second['noise'] - 1):+.1f}".replace("-", "−")
    return f"{text}; {noise_name} {change}%"


def format_true_epsilon(row: Optional[Row]) -> str:
    """For a run calibrated by an accountant that is not a valid bound: the interval its true epsilon
    lies in, from the exact lower bound to the smallest sound accountant's epsilon, in bold with
    "claim refuted" when the lower bound exceeds the claimed target."""
    if row is None or row["status"] != "ok" or row.get("lower_bound_epsilon") is None:
        return "—"
    lower = row["lower_bound_epsilon"]
    sound = [eps for name, eps in row["epsilon_by_accountant"].items() if ACCOUNTANTS[name].sound]
    sound += [row["sound_epsilon"]] if row.get("sound_epsilon") is not None else []
    text = f"{lower_bound_text(lower)} – {upper_bound_text(min(sound))}" if sound else f"≥ {lower_bound_text(lower)}"
    return f"**{text}: claim refuted**" if lower > row["target_epsilon"] else text


def format_accuracy_and_noise(row: Optional[Row], noise_name: str) -> str:
    """``88.03 (n=1), r = 0.0961``: the accuracy and the calibrated noise parameter."""
    if row is None or row["status"] != "ok":
        return format_accuracy(row)
    return f"{format_accuracy(row)}, {noise_name} = {noise_text(row['mechanism'], row['noise'], 3)}"


def format_published(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.2f}"


Line = tuple[str, list[str]]


@dataclass(frozen=True)
class SummaryGrid:
    """The lines of one dataset's summary table: a cell per target epsilon for each line."""

    rows: Sequence[Row]
    dataset: str
    epsilons: Sequence[float]
    columns: Sequence[Column]
    #: {eps: {calibrated_with: the paper's accuracy in percent}}
    published: dict[float, dict[str, float]]

    def cells(self, calibrated_with: str) -> list[Optional[Row]]:
        column = column_named(self.columns, calibrated_with)
        return [find_column_row(self.rows, self.dataset, eps, column) for eps in self.epsilons]

    def ours(self, calibrated_with: str, noise_name: Optional[str] = None) -> Line:
        """Our accuracy (with the calibrated noise when ``noise_name`` is given)."""
        cells = self.cells(calibrated_with)
        text = [format_accuracy(r) if noise_name is None else format_accuracy_and_noise(r, noise_name) for r in cells]
        return column_title(column_named(self.columns, calibrated_with)), text

    def paper(self, calibrated_with: str, label: str = PAPER_LINE) -> Line:
        """The paper's accuracy for ``calibrated_with``; none where that column has no run in the table, so
        that the line is left out rather than read as the paper's number for the column above it."""
        ran = any(row is not None for row in self.cells(calibrated_with))
        return f"*{label}*", [format_published(self.published.get(eps, {}).get(calibrated_with)) if ran else "—"
                              for eps in self.epsilons]

    def gain(self, label: str, first: str, second: str, noise_name: str = "noise") -> Line:
        return label, [format_gain(a, b, noise_name) for a, b in zip(self.cells(first), self.cells(second))]

    def true_epsilon(self, calibrated_with: str) -> Line:
        return f"*{TRUE_EPSILON_LINE}*", [format_true_epsilon(r) for r in self.cells(calibrated_with)]

    def markdown(self, lines: Sequence[Line]) -> str:
        """The table; lines without any entry are left out ("" when none of our columns was run)."""
        if not any(row is not None for column in self.columns for row in self.cells(column.calibrated_with)):
            return ""
        body = [[label, *cells] for label, cells in lines if any(cell != "—" for cell in cells)]
        return markdown([DATASET_NAMES.get(self.dataset, self.dataset), *[f"ε = {eps:g}" for eps in self.epsilons]],
                        body)


def join_summary(note: str, tables: Sequence[str]) -> str:
    """The note above the non-empty tables, or "(no runs yet)"."""
    tables = [t for t in tables if t]
    return "\n\n".join([note, *tables]) if tables else "(no runs yet)"


TABLE2_SUMMARY_NOTE = (
    f"Accuracy in % after T = {TABLE2_SETTINGS['steps']} steps, mean ± std over seeds (n seeds). *{PAPER_LINE}*: "
    "the Lap2 paper's Table II. *PLD − RDP*: points gained by calibrating with PLD instead of RDP at the same ε, "
    "paired by seed, and the change of the noise. * `lap2-paper` is not a valid bound; "
    f"*{TRUE_EPSILON_LINE}*: from the exact lower bound to the sound accountant's ε for its noise.")


def table2_summary_markdown(rows: Sequence[Row], datasets: Sequence[str],
                            epsilons: Sequence[float] = TABLE2_EPSILONS) -> str:
    """The Lap2 paper's Table II, compact: per dataset, every column at every epsilon, the paper's
    numbers below ours, and the PLD-calibrated columns next to the RDP-calibrated ones with the gain."""
    tables = []
    for dataset in datasets:
        grid = SummaryGrid(rows, dataset, epsilons, TABLE2_COLUMNS, table2_published(dataset))
        tables.append(grid.markdown([
            grid.ours("gaussian-rdp"), grid.paper("gaussian-rdp"),
            grid.ours("gaussian"), grid.gain("PLD − RDP", "gaussian", "gaussian-rdp"),
            grid.ours("laplace-l1-rdp"), grid.paper("laplace-l1-rdp"),
            grid.ours("laplace-l1"), grid.gain("PLD − RDP", "laplace-l1", "laplace-l1-rdp"),
            grid.ours("lap2-paper"), grid.paper("lap2-paper"), grid.true_epsilon("lap2-paper"),
            grid.ours("lap2-rdp"),
        ]))
    return join_summary(TABLE2_SUMMARY_NOTE, tables)


#: the columns of output mechanisms calibrated by Theorem 10's add/remove reading
DIRICHLET_READING_NOTE = (
    "* The Dirichlet and penultimate-Gaussian runs were calibrated by the Dirichlet paper's add/remove reading of "
    "its Theorem 10, which is not a bound under replace-one adjacency (docs/theory/dirichlet.md); "
    f"*{TRUE_EPSILON_LINE}*: the interval the true ε of the released outputs lies in, from the exact lower bound "
    "to the sound default accountant's ε for the same noise.")
DIRICHLET_SUMMARY_NOTE = (
    "Accuracy in %, mean ± std over seeds (n seeds), and the calibrated noise (r: the Dirichlet scale, larger is "
    "less noise; σ: the noise multiplier). *exact − Ponnoprat*: points gained by calibrating r with the exact base "
    "RDP instead of Ponnoprat's bound, paired by seed, and the change of r. † ε covers the released outputs, not "
    "the model's parameters. " + DIRICHLET_READING_NOTE)


def dirichlet_summary_markdown(rows: Sequence[Row], datasets: Sequence[str], epsilons: Sequence[float]) -> str:
    """The Dirichlet-mechanism comparison, compact: per dataset, every column at every epsilon."""
    paper = f"{PAPER_LINE} (ResNet-18, full training)"
    tables = []
    for dataset in datasets:
        grid = SummaryGrid(rows, dataset, epsilons, DIRICHLET_COLUMNS, DIRICHLET_PUBLISHED.get(dataset, {}))
        tables.append(grid.markdown([
            grid.ours("dirichlet-ponnoprat", "r"), grid.true_epsilon("dirichlet-ponnoprat"),
            grid.paper("dirichlet-ponnoprat", paper),
            grid.ours("dirichlet-add-remove", "r"), grid.true_epsilon("dirichlet-add-remove"),
            grid.gain("exact − Ponnoprat", "dirichlet-add-remove", "dirichlet-ponnoprat", "r"),
            grid.ours("gaussian-rdp", "σ"),
            grid.ours("penultimate-gaussian-rdp", "σ"), grid.true_epsilon("penultimate-gaussian-rdp"),
            grid.paper("penultimate-gaussian-rdp", paper),
        ]))
    return join_summary(DIRICHLET_SUMMARY_NOTE, tables)


FINETUNE_SUMMARY_NOTE = (
    f"Accuracy in %, mean ± std over seeds (n seeds); *{PAPER_LINE}*: the Lap2 paper's fully fine-tuned ViT "
    "(CIFAR-10) and RoBERTa-base (SST-2). * `lap2-paper` is not a valid bound; "
    f"*{TRUE_EPSILON_LINE}*: from the exact lower bound to the sound accountant's ε for its noise.")


def finetune_summary_markdown(rows: Sequence[Row], datasets: Sequence[str]) -> str:
    """The fine-tuning stand-ins, compact: per task, every column at every epsilon."""
    tables = []
    for dataset in datasets:
        epsilons = sorted({r["target_epsilon"] for r in rows if r["dataset"] == dataset}, reverse=True)
        grid = SummaryGrid(rows, dataset, epsilons, FINETUNE_COLUMNS, FINETUNE_PUBLISHED.get(dataset, {}))
        tables.append(grid.markdown([
            grid.ours("gaussian-rdp"), grid.paper("gaussian-rdp"),
            grid.ours("lap2-paper"), grid.paper("lap2-paper"), grid.true_epsilon("lap2-paper"),
            grid.ours("lap2-rdp"),
        ]))
    return join_summary(FINETUNE_SUMMARY_NOTE, tables)


def finetune_full_epsilons(rows: Sequence[Row]) -> list[float]:
    """The target epsilons run, largest first (the paper's Table III order)."""
    return sorted({r["target_epsilon"] for r in rows}, reverse=True)


def task_key(row: Row) -> tuple[str, str, Optional[int]]:
    """(dataset, parameters trained, planned steps) of a run; models without a choice of parameters
    (``trainable`` None) train them all."""
    return row["dataset"], row.get("trainable") or "all", row.get("steps_planned")


def by_task(rows: Sequence[Row]) -> list[tuple[str, str, list[Row]]]:
    """(dataset, caption, its rows) for each dataset, set of trained parameters and run length (SST-2 first,
    every parameter first, then the fewest steps first); the caption names the task, the parameters trained,
    their number and the steps T.  Models without a choice of parameters (``trainable`` None) train them all."""
    keys = sorted({task_key(r) for r in rows},
                  key=lambda key: (key[0] != "sst2", key[0], key[1] != "all", key[1], key[2] or 0))
    groups = []
    for dataset, part, steps in keys:
        members = [r for r in rows if task_key(r) == (dataset, part, steps)]
        sizes = sorted({r["params"] for r in members if r.get("params")})
        size = f" ({', '.join(f'{n:,}' for n in sizes)} parameters trained)" if sizes else ""
        length = "" if steps is None else f", T = {steps} steps"
        trained = "every parameter" if part == "all" else f"--trainable {part}"
        task, model = FINETUNE_FULL_MODELS[dataset]
        groups.append((dataset, f"{task}, {model}, {trained}{size}{length}", members))
    return groups


#: each finetune-full task and the model it fine-tunes, as the captions name them
FINETUNE_FULL_MODELS = {"sst2": ("SST-2", "MiniLM-L6"), "cifar10-jpeg": ("CIFAR-10", "EfficientNet-Lite0")}


def finetune_full_markdown(rows: Sequence[Row]) -> str:
    """Full fine-tuning, one line per run configuration next to the paper's fully fine-tuned RoBERTa-base or ViT;
    one table per task, set of trained parameters and run length."""
    return "\n\n".join(f"### {caption}\n\n" + long_table(members, dataset, finetune_full_epsilons(members),
                                                         FINETUNE_FULL_COLUMNS, FINETUNE_FULL_PUBLISHED[dataset])
                        for dataset, caption, members in by_task(rows))


_SST2 = FINETUNE_FULL_TASKS["sst2"][0]
_CIFAR = FINETUNE_FULL_TASKS["cifar10-jpeg"][0]
FINETUNE_FULL_SUMMARY_NOTES = {
    "sst2": (
        "SST-2 dev accuracy in % (872 sentences), mean ± std over seeds (n seeds), and the calibrated noise relative "
        "to the clipping norm C (σ: the Gaussian noise multiplier; b/C: the Laplace scale per coordinate over C, as σ "
        "is; the records hold the absolute b), MiniLM-L6 (the parameters trained above each table) for the T steps "
        f"named above each table at batch {_SST2['batch_size']}, sentences cut to {_SST2['max_length']} tokens, "
        f"clipping norm {_SST2['clip']:g}, Adam lr {_SST2['lr']:g}. *{PAPER_LINE}*: the Lap2 paper's Table III "
        "(RoBERTa-base, 125M parameters, its Gaussian and Laplace-L1 accounted by RDP)."),
    "cifar10-jpeg": (
        f"CIFAR-10 (JPEG copy) test accuracy in % ({_CIFAR['test_limit']:,} test images), mean ± std over seeds "
        "(n seeds), and the calibrated noise relative to C as above, EfficientNet-Lite0 (ImageNet weights, every "
        f"parameter trained, BatchNorm frozen at its ImageNet statistics) for the T steps named above each table at "
        f"batch {_CIFAR['batch_size']} of a {_CIFAR['train_limit']:,}-image training subset (the paper's q = 0.01668), "
        f"images at {_CIFAR['resolution']} px, clipping norm {_CIFAR['clip']:g}, Adam lr {_CIFAR['lr']:g}. "
        f"*{PAPER_LINE}*: the Lap2 paper's Table II fine-tuning column (ViT at 224 px, 900 steps, its Gaussian and "
        "Laplace-L1 accounted by RDP)."),
}
FINETUNE_FULL_SUMMARY_NOTE = (
    "*Lap2 − Gaussian*: points, paired by seed, at the same sound ε, and the change of the noise parameter. "
    f"* `lap2-paper` is not a valid bound; *{TRUE_EPSILON_LINE}*: from the exact lower bound to the sound "
    "accountant's ε for its noise.")


def finetune_full_summary_markdown(rows: Sequence[Row]) -> str:
    """Full fine-tuning, compact: per task, every column at every epsilon run, the paper's numbers below ours."""
    # the Laplace scales relative to C, so that they read (and the gain line compares them) as the multiplier σ
    relative = [dict(r, noise=r["noise"] / r["clip"]) if r["status"] == "ok" and r["mechanism"] != "gaussian" else r
                for r in rows]
    groups = by_task(relative)
    notes = [FINETUNE_FULL_SUMMARY_NOTES[d] for d in dict.fromkeys(dataset for dataset, _, _ in groups)]
    tables = []
    for dataset, caption, members in groups:
        grid = SummaryGrid(members, dataset, finetune_full_epsilons(members), FINETUNE_FULL_COLUMNS,
                           FINETUNE_FULL_PUBLISHED[dataset])
        tables.append(f"**{caption}**\n\n" + grid.markdown([
            grid.ours("gaussian", "σ"), grid.paper("gaussian"),
            grid.ours("lap2", "b/C"), grid.gain("Lap2 − Gaussian", "lap2", "gaussian"),
            grid.ours("lap2-paper", "b/C"), grid.paper("lap2-paper"), grid.true_epsilon("lap2-paper"),
            grid.ours("laplace-l1", "b/C"), grid.paper("laplace-l1"),
        ]))
    return join_summary(" ".join([*notes, FINETUNE_FULL_SUMMARY_NOTE]), tables)


def alpha_grid_summary_markdown(rows: Sequence[Row]) -> str:
    """The alpha x effective-learning-rate grid as it stands (already compact), without the scope line."""
    table = alpha_grid_markdown(rows, scope_note=False)
    if table == "(no runs yet)":
        return table
    ok = [r for r in rows if r["status"] == "ok"]
    setting = ", ".join([*sorted({DATASET_NAMES.get(r["dataset"], r["dataset"]) for r in ok}),
                         *sorted({f"ε = {r['target_epsilon']:g}" for r in ok}),
                         *sorted({f"T = {r['steps_planned']} steps" for r in ok})])
    note = (f"Accuracy in %, mean over seeds (n seeds); {setting}; SGD with learning rate γ = γ_eff / κ(0.9; r*, α) "
            "for the effective learning rate γ_eff. ε covers the released outputs, not the model's parameters.")
    return f"{note}\n\n{table}"


# --- Tramèr & Boneh's ScatterNet recipe (experiment "scatternet") ----------------------------------------------

#: The heads trained on the ScatterNet features: model -> how the tables name it.
SCATTERNET_HEADS = {"scatternet-linear": "linear", "scatternet-cnn": "CNN"}
#: Tramèr & Boneh publish their accuracies at (3, 1e-5).
SCATTERNET_PUBLISHED_EPSILON = 3.0
SCATTERNET_PAPER_LINE = "↳ Tramèr & Boneh"
#: How the summary names each mechanism's noise parameter.
NOISE_NAMES = {"gaussian": "σ", "lap2": "b", "laplace-l1": "b", "dirichlet": "r"}
SCATTERNET_SCOPE_NOTE = f"† Dirichlet rows. {OUTPUT_PRIVACY_SCOPE}"
#: Our CIFAR-10 is the lossy copy in the shared data folder, not the set the published numbers are on.
CIFAR_COPY_NOTE = ("Tramèr & Boneh's CIFAR-10 numbers are on the original images; ours are on a JPEG (quality about 75) "
                   "copy, on which networks that score 92–94 % on CIFAR-10 score 81–83 %, so the two are not "
                   "comparable point for point.")


def mean_train_minutes(records: Sequence[dict[str, Any]], row: Row) -> str:
    """Mean training wall time (``train_wall_time_s``) of the runs aggregated into ``row``, in minutes."""
    times = [r["train_wall_time_s"] for r in records
             if r["status"] == "ok" and all(group_value(r, k) == row[k] for k in GROUP_KEYS)]
    return f"{statistics.fmean(times) / 60:.1f}" if times else "—"


def ema_decays(rows: Sequence[Row]) -> list[float]:
    """The decays of the parameter-average variants among ``rows`` (runs with ``ema_decay`` set)."""
    return sorted({r["ema_decay"] for r in rows if r.get("ema_decay") is not None})


def ema_label(label: str, decay: float) -> str:
    return f"{label} + EMA {decay:g}"


def statistics_noises(rows: Sequence[Row]) -> list[float]:
    """The noise multipliers of the runs whose features were standardised with noisy channel statistics."""
    return sorted({r["feature_statistics_noise"] for r in rows if r.get("feature_statistics_noise") is not None})


def statistics_label(label: str, sigma: float) -> str:
    return f"{label} + noisy channel statistics σ {sigma:g}"


def variants(rows: Sequence[Row]) -> list[tuple[dict[str, Optional[float]], Callable[[str], str]]]:
    """(fields, how the row's label changes) of the plain recipe and of each variant among ``rows``:
    an EMA decay, or features standardised with noisy channel statistics instead of GroupNorm."""
    plain = {"ema_decay": None, "feature_statistics_noise": None}
    return [(plain, lambda label: label),
            *[({**plain, "ema_decay": d}, lambda label, d=d: ema_label(label, d)) for d in ema_decays(rows)],
            *[({**plain, "feature_statistics_noise": s}, lambda label, s=s: statistics_label(label, s))
              for s in statistics_noises(rows)]]


def ema_note(rows: Sequence[Row]) -> str:
    """What the EMA rows are, when there are any ("" otherwise)."""
    notes = []
    if ema_decays(rows):
        notes.append(" *+ EMA d*: the same configuration evaluated on an exponential moving average of its "
                     "parameters (decay d), post-processing at the same ε.")
    if statistics_noises(rows):
        notes.append(" *+ noisy channel statistics σ s*: the features standardised per channel with a mean and a "
                     "variance released with Gaussian noise of multiplier s (Tramèr & Boneh's normalisation, "
                     "thresholds from noisy quantiles) instead of GroupNorm; the release is inside the same ε.")
    return "".join(notes)


def scatternet_published_table(rows: Sequence[Row], records: Sequence[dict[str, Any]]) -> str:
    """Gaussian at epsilon 3 per dataset and head: ours next to Tramèr & Boneh's published accuracy, the
    difference, the mean training time of a run, and the Lap2 paper's Gaussian CNN on raw pixels (at its
    own epsilon 3.42) where it exists ("" when none of these configurations was run); the plain recipe's
    row, then one per EMA variant that was run."""
    gaussian = SCATTERNET_COLUMNS[0]
    body, found = [], False
    for dataset in SCATTERNET_DATASETS:
        lap2_paper = TABLE2_PUBLISHED.get(dataset, {}).get("gaussian-rdp", (None,))[0]
        for model, head in SCATTERNET_HEADS.items():
            paper = SCATTERNET_PUBLISHED[dataset, model]
            for fields, label in variants(rows):
                row = find_row(rows, dataset=dataset, model=model, target_epsilon=SCATTERNET_PUBLISHED_EPSILON,
                               mechanism=gaussian.mechanism, calibrated_with=gaussian.calibrated_with, **fields)
                if any(v is not None for v in fields.values()) and row is None:
                    continue
                found = found or row is not None
                ok = row is not None and row["status"] == "ok"
                body.append([DATASET_NAMES.get(dataset, dataset), label(head),
                             format_accuracy(row), format_published(paper),
                             f"{100 * row['accuracy_mean'] - paper:+.2f}" if ok else "—",
                             mean_train_minutes(records, row) if ok else "—", format_published(lap2_paper)])
    header = ["dataset", "head", f"ours: accuracy % (ε = {SCATTERNET_PUBLISHED_EPSILON:g})", "Tramèr & Boneh %",
              "ours − Tramèr & Boneh (points)", "training time of a run (min)",
              f"Lap2 paper's CNN, Gaussian (RDP), at ε = {TABLE2_EPSILONS[0]:g} %"]
    return markdown(header, body) if found else ""


def scatternet_markdown(rows: Sequence[Row], records: Sequence[dict[str, Any]]) -> str:
    """Tramèr & Boneh's ScatterNet recipe, Gaussian at epsilon 3, against their published numbers."""
    table = scatternet_published_table(rows, records)
    if not table:
        return "(no runs yet)"
    return (f"{table}\n\nAccuracy in %, mean ± std over seeds (n seeds); —: not run yet. The Lap2 paper's number "
            f"is for its own CNN on raw pixels, at ε = {TABLE2_EPSILONS[0]:g}, not {SCATTERNET_PUBLISHED_EPSILON:g}. "
            f"{CIFAR_COPY_NOTE}{ema_note(rows)}")


def scatternet_grid(rows: Sequence[Row], dataset: str, ema_decay: Optional[float] = None) -> SummaryGrid:
    """The linear head's runs on ``dataset`` (the plain recipe's, or the EMA variant's with ``ema_decay``):
    every mechanism at every epsilon (the plan's and any other run, of either), with Tramèr & Boneh's
    Gaussian number at epsilon 3 as the paper's."""
    linear = [r for r in rows if r["model"] == "scatternet-linear"]
    epsilons = sorted({*SCATTERNET_EPSILONS, *(r["target_epsilon"] for r in linear if r["dataset"] == dataset)})
    published = {SCATTERNET_PUBLISHED_EPSILON: {"gaussian": SCATTERNET_PUBLISHED[dataset, "scatternet-linear"]}}
    return SummaryGrid([r for r in linear if r.get("ema_decay") == ema_decay
                        and r.get("feature_statistics_noise") is None], dataset, epsilons,
                       SCATTERNET_COLUMNS, published)


def scatternet_lines(rows: Sequence[Row], grid: SummaryGrid, with_noise: bool) -> list[Line]:
    """Every mechanism's accuracy (with its noise when ``with_noise``), Tramèr & Boneh's below the
    Gaussian's, its EMA variants of ``rows`` below (lines left out where none was run), and Lap2's gap
    to Gaussian: Gaussian minus Lap2 in points, paired by seed (plain recipe only)."""
    averaged = [(decay, scatternet_grid(rows, grid.dataset, decay)) for decay in ema_decays(rows)]
    lines = []
    for column in grid.columns:
        noise_name = NOISE_NAMES[column.mechanism] if with_noise else None
        lines.append(grid.ours(column.calibrated_with, noise_name))
        if column.mechanism == "gaussian":
            lines.append(grid.paper(column.calibrated_with, SCATTERNET_PAPER_LINE))
        if not ACCOUNTANTS[column.calibrated_with].sound:
            lines.append(grid.true_epsilon(column.calibrated_with))
        for decay, variant in averaged:
            label, cells = variant.ours(column.calibrated_with, noise_name)
            lines.append((ema_label(label, decay), cells))
    gap = [format_paired_rows(*pair) for pair in zip(grid.cells("gaussian"), grid.cells("lap2"))]
    return [*lines, ("Gaussian − Lap2 (points)", gap)]


def noise_table(grid: SummaryGrid) -> str:
    """The noise each mechanism was calibrated to at each epsilon, and its unit."""
    body = []
    for column in grid.columns:
        cells = grid.cells(column.calibrated_with)
        units = sorted({r["noise_unit"] for r in cells if r is not None and r["status"] == "ok"})
        if units:
            body.append([column.label, *map(format_noise, cells), ", ".join(units)])
    return markdown(["noise", *[f"ε = {eps:g}" for eps in grid.epsilons], "unit"], body)


def scatternet_mechanisms_markdown(rows: Sequence[Row]) -> str:
    """Every mechanism under Tramèr & Boneh's recipe (linear head), per comparison dataset: accuracy per
    epsilon with Lap2's gap to Gaussian, and the calibrated noise."""
    parts = []
    for dataset in SCATTERNET_COMPARISON_DATASETS:
        grid = scatternet_grid(rows, dataset)
        accuracy = grid.markdown(scatternet_lines(rows, grid, with_noise=False))
        if accuracy:
            parts += [f"### {dataset}", "", accuracy, "", noise_table(grid), ""]
    if not parts:
        return "(no runs yet)"
    note = ("Accuracy in %, mean ± std over seeds (n seeds); every mechanism calibrated and accounted by its "
            f"sound default accountant but the Dirichlet mechanism (*). *Gaussian − Lap2*: points, paired by seed. "
            f"{DIRICHLET_READING_NOTE}{ema_note(rows)}")
    return "\n".join([note, "", *parts, SCATTERNET_SCOPE_NOTE])


SCATTERNET_SUMMARY_NOTE = (
    "Tramèr & Boneh's ScatterNet recipe. Accuracy in %, mean ± std over seeds (n seeds), and the calibrated noise "
    "(σ: the noise multiplier; b: the absolute Laplace scale per coordinate; r: the Dirichlet scale). First "
    f"Gaussian at ε = {SCATTERNET_PUBLISHED_EPSILON:g} against the published numbers, then every mechanism with "
    f"the linear head; *{SCATTERNET_PAPER_LINE}*: their Gaussian at ε = {SCATTERNET_PUBLISHED_EPSILON:g}; "
    "*Gaussian − Lap2*: points, paired by seed. † ε covers the released outputs, not the model's parameters. "
    + DIRICHLET_READING_NOTE)


def scatternet_summary_markdown(rows: Sequence[Row], records: Sequence[dict[str, Any]]) -> str:
    """Tramèr & Boneh's recipe, compact: the published comparison, then one mechanism table per dataset."""
    grids = [scatternet_grid(rows, dataset) for dataset in SCATTERNET_COMPARISON_DATASETS]
    return join_summary(f"{SCATTERNET_SUMMARY_NOTE} {CIFAR_COPY_NOTE}{ema_note(rows)}",
                        [scatternet_published_table(rows, records),
                         *[g.markdown(scatternet_lines(rows, g, with_noise=True)) for g in grids]])


def clipping_markdown(rows: Sequence[Row], flat_rows: Sequence[Row]) -> str:
    """Accuracy of each clipping rule beside flat clipping (its task's own flat runs: same settings, steps and
    seeds), and each rule minus flat, paired by seed; one table per dataset, epsilon and T."""
    tables = []
    for dataset, eps, steps in dict.fromkeys((r["dataset"], r["target_epsilon"], r["steps_planned"]) for r in rows):
        task = CLIPPING_TASKS[dataset]
        same_settings = {k: v for k, v in task.settings.items() if k in GROUP_KEYS}
        body = []
        for column in task.columns:
            cell = dict(same_settings, dataset=dataset, target_epsilon=eps, steps_planned=steps,
                        mechanism=column.mechanism, calibrated_with=column.calibrated_with)
            flat = find_row(flat_rows, **cell, experiment=task.flat_experiment)
            ruled = [find_row(rows, **cell, clipping=rule) for rule in CLIPPING_RULES]
            body.append([column.label, format_accuracy(flat), *map(format_accuracy, ruled),
                         *(format_paired_rows(row, flat) for row in ruled)])
        header = ["", f"flat ({task.flat_experiment})", *CLIPPING_RULES,
                  *(f"{rule} − flat" for rule in CLIPPING_RULES)]
        tables.append(f"**{task.model_label}, {dataset}, ε = {eps:g}** (T = {steps}, "
                      f"B = {task.settings['batch_size']}, C = {task.settings['clip']:g})\n\n" + markdown(header, body))
    return "\n\n".join(tables) if tables else "No runs yet."
