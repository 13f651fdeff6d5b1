"""Regenerate an experiment's aggregate (in the results folder), markdown tables and figures (in the reports folder).

Each experiment writes a detailed table (``<experiment>.md``: one line per configuration with noise, epsilons,
commits and the exact commands) and a compact one (``summary_<experiment>.md``: mean ± std over seeds per
cell, the form the results pages show).  ``python -m reproductions ... --page docs/results`` splices every
generated table into the ``<!-- generated:NAME -->`` blocks of the per-experiment pages in that folder
(``docs/results/<experiment>.md``; :func:`splice_into_pages`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from reproductions import figures, plans, tables
from reproductions.lower_bounds import annotate_lower_bounds
from reproductions.records import aggregate, load_records, write_aggregate


def datasets_of(rows: list[dict]) -> list[str]:
    """Datasets present in ``rows``, in first-seen order."""
    return list(dict.fromkeys(r["dataset"] for r in rows))


def table2_report(results_dir: Path, figures_dir: Path) -> list[Path]:
    records = load_records(results_dir, "table2")
    if not records:
        return []
    rows = annotate_lower_bounds(aggregate(records), results_dir / "table2")
    datasets = datasets_of(rows)
    published = {d: tables.table2_published(d) for d in plans.TABLE2_PUBLISHED}
    convergence = [f"### {d}: steps to reach the Lap2 paper's Fig. 8 accuracy targets\n\n"
                   + tables.convergence_markdown(records, d, plans.TABLE2_COLUMNS) for d in datasets]
    table = write_markdown(figures_dir / "table2.md", "Lap2 paper, Table II (CNN on MNIST and Fashion-MNIST)",
                           "\n\n".join([tables.table2_markdown(rows, datasets), *convergence]))
    paired = write_markdown(figures_dir / "table2_paired.md", "Lap2 paper, Table II: differences between columns, "
                            "paired by seed (accuracy points)", tables.paired_differences_markdown(rows, datasets))
    summary = write_markdown(figures_dir / "summary_table2.md", "Lap2 paper, Table II: summary",
                             tables.table2_summary_markdown(rows, datasets))
    return [table, paired, summary,
            *comparison_figures(records, rows, "table2", plans.TABLE2_COLUMNS, published, figures_dir,
                                "Lap2 paper, Table II: accuracy vs epsilon (ours solid, the paper's dashed)")]


def clipping_report(results_dir: Path, figures_dir: Path) -> list[Path]:
    """Clipping rules against flat clipping (the flat runs are each task's own experiment's records)."""
    rows = aggregate(load_records(results_dir, "clipping"))
    flat = aggregate([record for experiment in dict.fromkeys(t.flat_experiment for t in plans.CLIPPING_TASKS.values())
                      for record in load_records(results_dir, experiment)])
    return [write_markdown(figures_dir / "summary_clipping.md", "Clipping rules: accuracy in %, "
                           "mean ± std over seeds, and each rule minus flat clipping paired by seed",
                           tables.clipping_markdown(rows, flat))]


def comparison_figures(records: list[dict], rows: list[dict], experiment: str, columns: tuple[plans.Column, ...],
                       published: dict, figures_dir: Path, title: str) -> list[Path]:
    """Accuracy vs epsilon (all datasets) and one convergence figure per dataset."""
    datasets = datasets_of(rows)
    return [figures.accuracy_vs_epsilon(rows, datasets, columns, published,
                                        figures_dir / f"{experiment}_accuracy_vs_epsilon.png", title),
            *[figures.convergence(records, d, columns, figures_dir / f"{experiment}_convergence_{d}.png",
                                  f"Convergence on {d} (test accuracy after every epoch)") for d in datasets]]


def dirichlet_report(results_dir: Path, figures_dir: Path) -> list[Path]:
    """The mechanism comparison and the alpha x effective-lr grid (each drawn if it has records)."""
    return dirichlet_comparison_report(results_dir, figures_dir) + alpha_grid_report(results_dir, figures_dir)


def dirichlet_comparison_report(results_dir: Path, figures_dir: Path) -> list[Path]:
    records = load_records(results_dir, "dirichlet")
    if not records:
        return []
    rows = annotate_lower_bounds(aggregate(records), results_dir / "dirichlet")
    datasets = datasets_of(rows)
    epsilons = sorted({r["target_epsilon"] for r in rows})
    table = write_markdown(figures_dir / "dirichlet.md", "Dirichlet-mechanism paper: Dirichlet vs DP-SGD vs "
                           "penultimate Gaussian", tables.dirichlet_markdown(rows, datasets, epsilons))
    summary = write_markdown(figures_dir / "summary_dirichlet.md", "Dirichlet-mechanism paper, comparison: summary",
                             tables.dirichlet_summary_markdown(rows, datasets, epsilons))
    return [table, summary,
            *comparison_figures(records, rows, "dirichlet", plans.DIRICHLET_COLUMNS, plans.DIRICHLET_PUBLISHED,
                                figures_dir, "Dirichlet-mechanism paper, comparison: accuracy vs epsilon "
                                "(Dirichlet / penultimate: epsilon of the released outputs only; the paper's "
                                "CIFAR-10 dashed)")]


def alpha_grid_report(results_dir: Path, figures_dir: Path) -> list[Path]:
    rows = aggregate(load_records(results_dir, "dirichlet-alpha"))
    if not rows:
        return []
    return [write_markdown(figures_dir / "dirichlet_alpha.md", "Dirichlet-mechanism paper, Fig. 2 (reduced): "
                           "alpha x effective lr", tables.alpha_grid_markdown(rows)),
            write_markdown(figures_dir / "summary_dirichlet_alpha.md", "Dirichlet-mechanism paper, Fig. 2 "
                           "(reduced): summary", tables.alpha_grid_summary_markdown(rows)),
            figures.alpha_grid_figure(rows, figures_dir / "dirichlet_alpha_grid.png")]


def finetune_report(results_dir: Path, figures_dir: Path) -> list[Path]:
    rows = annotate_lower_bounds(aggregate(load_records(results_dir, "finetune")), results_dir / "finetune")
    if not rows:
        return []
    datasets = datasets_of(rows)
    return [write_markdown(figures_dir / "finetune.md", "Lap2 paper, fine-tuning stand-ins",
                           tables.finetune_markdown(rows, datasets)),
            write_markdown(figures_dir / "summary_finetune.md", "Lap2 paper, fine-tuning stand-ins: summary",
                           tables.finetune_summary_markdown(rows, datasets)),
            figures.accuracy_vs_epsilon(rows, datasets, plans.FINETUNE_COLUMNS, plans.FINETUNE_PUBLISHED,
                                        figures_dir / "finetune_accuracy_vs_epsilon.png",
                                        "Fine-tuning stand-ins (frozen encoder + private linear head; the paper: "
                                        "fully fine-tuned ViT / RoBERTa, dashed)")]


def finetune_full_report(results_dir: Path, figures_dir: Path) -> list[Path]:
    """Full fine-tuning (MiniLM-L6 on SST-2, EfficientNet-Lite0 on CIFAR-10) against the paper's Tables III and II,
    and accuracy vs epsilon for each task, choice of trained parameters and run length."""
    rows = annotate_lower_bounds(aggregate(load_records(results_dir, "finetune-full")), results_dir / "finetune-full")
    if not rows:
        return []
    return [write_markdown(figures_dir / "finetune_full.md", "Lap2 paper, Tables III and II at full dimension",
                           tables.finetune_full_markdown(rows)),
            write_markdown(figures_dir / "summary_finetune_full.md", "Lap2 paper, Tables III and II at full "
                           "dimension: summary", tables.finetune_full_summary_markdown(rows)),
            *(finetune_full_figure(rows, dataset, trainable, steps, results_dir, figures_dir)
              for dataset, trainable, steps in sorted({tables.task_key(r) for r in rows},
                                                      key=lambda key: (key[0] != "sst2", key[1] != "all", key)))]


#: the paper's model each finetune-full task stands in for
FINETUNE_FULL_PAPER_MODELS = {"sst2": "RoBERTa-base", "cifar10-jpeg": "ViT"}


def finetune_full_figure(rows: list[dict], dataset: str, trainable: str, steps: int, results_dir: Path,
                         figures_dir: Path) -> Path:
    """Accuracy vs epsilon of ``dataset``'s runs of ``steps`` steps training the ``trainable`` parameters (SST-2
    with every parameter at its planned steps: ``finetune_full_accuracy_vs_epsilon.png``; other choices and
    lengths add ``_<trainable>`` and ``_T<steps>``), with the not-private reference line of the same run where
    one was run."""
    settings = plans.FINETUNE_FULL_TASKS[dataset][0]
    stem = "finetune_full_accuracy_vs_epsilon" + ("" if dataset == "sst2" else f"_{dataset}")
    stem += ("" if trainable == "all" else f"_{trainable}") + ("" if steps == settings["steps"] else f"_T{steps}")
    trained = [r for r in rows if tables.task_key(r) == (dataset, trainable, steps)]
    sizes = sorted({r["params"] for r in trained if r.get("params")})
    if trainable == "all":
        what = f"all {sizes[0] / 1e6:.1f}M" if sizes else "every parameter"
    else:
        what = f"{trainable} ({sizes[0]:,} parameters)" if sizes else trainable
    _, model = tables.FINETUNE_FULL_MODELS[dataset]
    return figures.accuracy_vs_epsilon(
        trained, [dataset], plans.FINETUNE_FULL_COLUMNS, plans.FINETUNE_FULL_PUBLISHED, figures_dir / f"{stem}.png",
        f"{model}, {what} trained, T = {steps} (paper: {FINETUNE_FULL_PAPER_MODELS[dataset]})",
        references=finetune_full_reference(results_dir, dataset, steps, trainable))


#: the not-private reference runs of finetune-full (the same settings with almost no noise), where run: one
#: file each, ``{"command", "git_commit", "summary": dpnoise train --json's output, "what"}``
FINETUNE_FULL_REFERENCE_DIR = Path("finetune-full") / "reference"


def finetune_full_reference(results_dir: Path, dataset: str, steps: int,
                            trainable: str = "all") -> dict[str, tuple[str, float]]:
    """The reference line of a figure: the dev accuracy of the not-private run of ``dataset`` training the
    ``trainable`` parameters for ``steps`` steps (none without such a file)."""
    for path in sorted((Path(results_dir) / FINETUNE_FULL_REFERENCE_DIR).glob("*.json")):
        summary = json.loads(path.read_text())["summary"]
        if (summary["dataset"], summary["trainable"], summary["planned_steps"]) == (dataset, trainable, steps):
            return {dataset: (f"not private (σ {summary['noise']:g}), same {summary['steps']} steps",
                              100 * summary["test_accuracy"])}
    return {}


def scatternet_report(results_dir: Path, figures_dir: Path) -> list[Path]:
    """Tramèr & Boneh's ScatterNet recipe: ours against their numbers, every mechanism compared (tables that
    say "no runs yet" without records), and accuracy vs epsilon for each comparison dataset with runs."""
    records = load_records(results_dir, "scatternet")
    rows = annotate_lower_bounds(aggregate(records), results_dir / "scatternet")
    linear = [r for r in rows if r["model"] == "scatternet-linear" and r["status"] == "ok" and r["ema_decay"] is None
              and r.get("feature_statistics_noise") is None]
    figure_datasets = [d for d in plans.SCATTERNET_COMPARISON_DATASETS if d in datasets_of(linear)]
    return [write_markdown(figures_dir / "scatternet.md", "Tramèr & Boneh's ScatterNet recipe, Gaussian at ε = 3: "
                           "against the published numbers", tables.scatternet_markdown(rows, records)),
            write_markdown(figures_dir / "scatternet_mechanisms.md", "Tramèr & Boneh's ScatterNet recipe (linear "
                           "head): every mechanism", tables.scatternet_mechanisms_markdown(rows)),
            write_markdown(figures_dir / "summary_scatternet.md", "Tramèr & Boneh's ScatterNet recipe: summary",
                           tables.scatternet_summary_markdown(rows, records)),
            *[figures.accuracy_vs_epsilon(
                linear, [d], plans.SCATTERNET_COLUMNS, {}, figures_dir / f"scatternet_{d}.png",
                "ScatterNet + linear head (Tramèr & Boneh's recipe)",
                references={d: ("Tramèr & Boneh, Gaussian, eps 3",
                                plans.SCATTERNET_PUBLISHED[d, "scatternet-linear"])}) for d in figure_datasets]]


def accounting_figures(figures_dir: Path) -> list[Path]:
    """Privacy walls (what ``dpnoise walls`` draws) and noise needed vs epsilon (with its numbers as JSON)."""
    from dpnoise.plotting import walls_figure

    walls = figures_dir / "walls.png"
    walls_figure(walls)
    noise_png = figures_dir / "noise_vs_epsilon.png"
    noise_json = figures_dir / "noise_vs_epsilon.json"
    noise_json.write_text(json.dumps(figures.noise_vs_epsilon(noise_png), indent=1) + "\n")
    noise_table = write_markdown(figures_dir / "table2_noise.md", "Lap2 paper, Table II: calibrated noise per cell "
                                 "(accounting only; * = not a valid bound)", tables.table2_noise_markdown())
    return [walls, noise_png, noise_json, noise_table]


GENERATED_NOTE = "(generated by `python -m reproductions`; do not edit)"


def write_markdown(path: Path, title: str, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"## {title}\n\n{GENERATED_NOTE}\n\n{body}\n")
    return path


def splice_into_page(page: Path, generated: list[Path]) -> list[str]:
    """Copy each generated markdown file's body into ``page`` between the markers
    ``<!-- generated:STEM -->`` and ``<!-- /generated:STEM -->`` (STEM: the file's name without
    ``.md``), so a results page never holds a stale copy of a table.  The page is rewritten only if
    it changes.  Returns the stems spliced."""
    original = text = page.read_text()
    spliced = []
    for path in generated:
        if path.suffix != ".md":
            continue
        start, end = f"<!-- generated:{path.stem} -->", f"<!-- /generated:{path.stem} -->"
        if start not in text or end not in text:
            continue
        body = generated_body(path)
        head, rest = text.split(start, 1)
        text = f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"
        spliced.append(path.stem)
    if text != original:
        page.write_text(text)
    return spliced


def generated_body(path: Path) -> str:
    """A generated markdown file without its title and note: what a page's generated block holds."""
    return path.read_text().split(GENERATED_NOTE, 1)[-1].strip()


def splice_into_pages(pages: Path, generated: list[Path]) -> dict[Path, list[str]]:
    """:func:`splice_into_page` for one page, or for every ``*.md`` page of a folder (the per-experiment
    results pages, ``docs/results/``).  Returns each page that holds generated blocks -> the stems spliced."""
    pages = Path(pages)
    found = sorted(pages.glob("*.md")) if pages.is_dir() else [pages]
    return {page: stems for page in found if (stems := splice_into_page(page, generated))}


def write_aggregates(results_dir: Path) -> list[Path]:
    """``<results>/<experiment>/aggregate.json`` for every record folder (:data:`plans.RECORD_FOLDERS`) with
    records."""
    return [write_aggregate(results_dir, folder) for folder in plans.RECORD_FOLDERS
            if load_records(results_dir, folder)]


#: Experiment -> function regenerating its tables and figures from the records.
REPORTS: dict[str, Callable[[Path, Path], list[Path]]] = {
    "table2": table2_report,
    "dirichlet": dirichlet_report,
    "finetune": finetune_report,
    "finetune-full": finetune_full_report,
    "scatternet": scatternet_report,
    "clipping": clipping_report,
}
