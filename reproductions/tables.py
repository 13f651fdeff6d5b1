"""Markdown tables of aggregated results, next to the numbers the seeds publish."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from dpnoise.accounting import ACCOUNTANTS, OUTPUT_PRIVACY_SCOPE
from reproductions.plans import (
    ALPHA_GRID_ALPHAS,
    DIRICHLET_COLUMNS,
    DIRICHLET_PUBLISHED,
    FINETUNE_COLUMNS,
    FINETUNE_PUBLISHED,
    TABLE2_COLUMNS,
    TABLE2_COMPARISONS,
    TABLE2_EPSILONS,
    TABLE2_PUBLISHED,
    Column,
)
from reproductions.records import PairedDifference, format_accuracy, paired_difference

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


def format_epsilons(row: Optional[Row]) -> str:
    """``lap2 0.88, lap2-paper* 1.51`` (* marks an accountant that is not a valid bound), and for a
    run calibrated by such an accountant the exact lower bound on its true epsilon, in bold when it
    refutes the claimed target."""
    if row is None or row["status"] != "ok":
        return "—"
    text = ", ".join(f"{name}{'' if ACCOUNTANTS[name].sound else '*'} {eps:.3g}"
                     for name, eps in row["epsilon_by_accountant"].items())
    lower = row.get("lower_bound_epsilon")
    if lower is None:
        return text
    bound = f"true ε ≥ {lower:.3g}"
    return f"{text}; **{bound}: claim refuted**" if lower > row["target_epsilon"] else f"{text}; {bound}"


def format_noise(row: Optional[Row]) -> str:
    if row is None or row["status"] != "ok":
        return "—"
    return f"{row['noise']:.4g}"


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

    ``published[eps][calibrated_with]`` is the seed's accuracy in percent for that column.
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
    header = ["target ε", "column", "noise", "steps", "ε by accountant (δ=1e-5)", "ours: accuracy %", "seed's %",
              "commit"]
    return "\n".join([markdown(header, body), "", "<details><summary>exact commands (one per seed)</summary>", "",
                      *commands, "", "</details>"])


def table2_published(dataset: str) -> dict[float, dict[str, float]]:
    """Seed 1 Table II for ``dataset`` as {eps: {calibrated_with: accuracy}}."""
    columns = TABLE2_PUBLISHED[dataset]
    return {eps: {name: values[i] for name, values in columns.items()} for i, eps in enumerate(TABLE2_EPSILONS)}


def table2_markdown(rows: Sequence[Row], datasets: Sequence[str]) -> str:
    """Seed 1 Table II, ours next to the published numbers, one table per dataset."""
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


def paired_differences_markdown(rows: Sequence[Row], datasets: Sequence[str],
                                comparisons: Sequence[tuple[Column, Column]] = TABLE2_COMPARISONS,
                                epsilons: Sequence[float] = TABLE2_EPSILONS) -> str:
    """Per (dataset, epsilon): accuracy of one column minus another's, paired by seed, with the
    number of seeds in which the first column is ahead."""

    body = []
    for dataset in datasets:
        for eps in epsilons:
            cells = []
            for first, second in comparisons:
                pair = find_column_row(rows, dataset, eps, first), find_column_row(rows, dataset, eps, second)
                cells.append(format_paired_difference(None if None in pair else paired_difference(*pair)))
            if any(cell != "—" for cell in cells):
                body.append([dataset, f"{eps:g}", *cells])
    if not body:
        return "(no runs yet)"
    header = ["dataset", "target ε", *[f"{first.label} − {second.label}" for first, second in comparisons]]
    return markdown(header, body)


def dirichlet_markdown(rows: Sequence[Row], datasets: Sequence[str], epsilons: Sequence[float]) -> str:
    """Seed 2 comparison; unreachable targets are listed with the calibrator's reason."""
    parts = []
    for dataset in datasets:
        published = DIRICHLET_PUBLISHED.get(dataset, {})
        parts += [f"### {dataset}", "", long_table(rows, dataset, epsilons, DIRICHLET_COLUMNS, published), ""]
    unreachable = [r for r in rows if r["status"] == "unreachable"]
    parts += [f"- unreachable: {r['dataset']} {r['mechanism']} ε={r['target_epsilon']:g}: {r['reason']}"
              for r in unreachable]
    parts.append(f"\n† Dirichlet and penultimate-Gaussian rows. {OUTPUT_PRIVACY_SCOPE}")
    cifar = DIRICHLET_PUBLISHED["cifar10-jpeg"]
    parts.append(f"\nSeed 2 publishes CIFAR10 only (ResNet-18, full training): Dirichlet {cifar[4.0]['dirichlet-ponnoprat']}% "
                 f"at ε=4 and {cifar[1.0]['dirichlet-ponnoprat']}% at ε=1; Monir & Ghinita (penultimate layer) "
                 f"{cifar[4.0]['penultimate-gaussian-rdp']}% at ε=4.")
    return "\n".join(parts)


def alpha_grid_markdown(rows: Sequence[Row]) -> str:
    """Seed 2 Fig. 2 (reduced): accuracy per alpha (rows) and effective learning rate (columns)."""
    lrs = sorted({r["effective_lr"] for r in rows})
    body = []
    for alpha in ALPHA_GRID_ALPHAS:
        row_r = find_row(rows, alpha=alpha)
        if row_r is None:
            continue
        cells = [format_accuracy(find_row(rows, alpha=alpha, effective_lr=lr)) for lr in lrs]
        body.append([f"{alpha:g}", format_noise(row_r), *cells])
    header = ["alpha", "r* (ε=1)", *[f"γ_eff={lr:g}" for lr in lrs]]
    return (markdown(header, body) + f"\n\nEvery row: {OUTPUT_PRIVACY_SCOPE}") if body else "(no runs yet)"


def finetune_markdown(rows: Sequence[Row], datasets: Sequence[str]) -> str:
    """Fine-tuning stand-ins next to the seed's ViT / RoBERTa numbers (different models!)."""
    parts = []
    for dataset in datasets:
        published = FINETUNE_PUBLISHED[dataset]
        epsilons = sorted({r["target_epsilon"] for r in rows if r["dataset"] == dataset}, reverse=True)
        parts += [f"### {dataset}", "", long_table(rows, dataset, epsilons, FINETUNE_COLUMNS, published), ""]
    return "\n".join(parts)


def table2_noise_markdown(epsilons: Sequence[float] = TABLE2_EPSILONS) -> str:
    """Accounting only: the noise each Table II column is calibrated to, and its epsilon under every
    accountant that applies (seed 1 MNIST/FMNIST setting: q = 0.0043, T = 5860, C = 1, n = 26,010)."""
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
                eps_text = ", ".join(f"{name}{'' if ACCOUNTANTS[name].sound else '*'} {value:.3g}"
                                     for name, value in result.epsilon_by_accountant.items())
                body.append([f"{eps:g}", column.label, f"{result.noise:.4g}", eps_text])
    return markdown(["target ε", "column", "calibrated noise (σ, or b at C=1)", "ε by accountant (δ=1e-5)"], body)


#: Seed 1 Fig. 8 accuracy targets (percent) per dataset.
CONVERGENCE_TARGETS = {"fashion-mnist": (80.0, 82.0), "mnist": (95.0,)}


def first_step_reaching(curve: Sequence[dict[str, Any]], target_percent: float) -> Optional[int]:
    """First evaluated step whose test accuracy is at least ``target_percent`` (None: never)."""
    return next((p["step"] for p in curve if 100 * p["test_accuracy"] >= target_percent), None)


def convergence_markdown(records: Sequence[dict[str, Any]], dataset: str, columns: Sequence[Column]) -> str:
    """Seed 1 Fig. 8 as numbers: steps until the test accuracy first reaches each target, per run.

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
