"""Paired comparisons between Table II columns and the compact summaries of the results page (no training:
aggregated rows built by hand)."""

from __future__ import annotations

import pytest

from reproductions.plans import TABLE2_COLUMNS
from reproductions.records import mean_std, paired_difference
from reproductions.tables import paired_differences_markdown

GAUSSIAN, LAPLACE_L1, LAP2_PAPER, LAP2 = TABLE2_COLUMNS[:4]


def row(column, seeds, accuracies, dataset="mnist", eps=0.88, status="ok"):
    return dict(dataset=dataset, target_epsilon=eps, mechanism=column.mechanism,
                calibrated_with=column.calibrated_with, status=status, seeds=seeds, accuracies=accuracies)


def test_difference_is_taken_seed_by_seed_over_the_common_seeds():
    first = row(GAUSSIAN, [0, 1, 2], [0.90, 0.80, 0.70])
    second = row(LAP2, [1, 2, 5], [0.70, 0.75, 0.10])
    difference = paired_difference(first, second)
    assert difference.n == 2 and difference.positive == 1
    assert difference.mean == pytest.approx((0.10 - 0.05) / 2)
    assert difference.std == pytest.approx(0.15 / 2 ** 0.5)


def test_no_common_seed_or_an_unreachable_row_gives_no_difference():
    assert paired_difference(row(GAUSSIAN, [0], [0.9]), row(LAP2, [1], [0.8])) is None
    unreachable = dict(row(LAP2, [0], [0.8]), status="unreachable")
    assert paired_difference(row(GAUSSIAN, [0], [0.9]), unreachable) is None


def test_markdown_lists_each_comparison_and_skips_cells_without_pairs():
    rows = [row(GAUSSIAN, [0, 1], [0.97, 0.96]), row(LAP2, [0, 1], [0.96, 0.965]),
            row(GAUSSIAN, [0], [0.8], dataset="fashion-mnist", eps=3.42)]
    text = paired_differences_markdown(rows, ["mnist", "fashion-mnist"], comparisons=[(GAUSSIAN, LAP2)])
    assert "Gaussian (RDP) − Lap2 (b from sound lap2-rdp)" in text
    assert "| mnist | 0.88 | +0.25 ± 1.06 (ahead in 1 of 2 seeds) |" in text
    assert "fashion-mnist" not in text.split("\n", 2)[2]


def test_summary_puts_the_pld_row_next_to_the_rdp_row_with_the_paired_gain_and_n():
    from reproductions.tables import table2_summary_markdown

    def aggregated(column, seeds, accuracies, noise):
        mean, std = mean_std(accuracies)
        return dict(row(column, seeds, accuracies, eps=0.13), noise=noise, accuracy_mean=mean, accuracy_std=std,
                    n_seeds=len(seeds))

    pld = TABLE2_COLUMNS[4]  # Gaussian calibrated by the PLD accountant
    rows = [aggregated(GAUSSIAN, [0, 1, 2], [0.90, 0.80, 0.70], 8.832), aggregated(pld, [0], [0.91], 8.022)]
    text = table2_summary_markdown(rows, ["mnist"], epsilons=[3.42, 0.13])
    lines = text.splitlines()
    assert "| MNIST | ε = 3.42 | ε = 0.13 |" in lines
    ours = lines.index("| Gaussian (RDP) | — | 80.00 ± 10.00 (n=3) |")
    assert lines[ours + 1] == "| *↳ paper* | 97.27 | 87.44 |"  # the paper's Table II, below ours
    assert lines[ours + 2] == "| Gaussian (PLD) | — | 91.00 (n=1) |"
    assert lines[ours + 3] == "| PLD − RDP | — | +1.00 (1/1 seeds ahead); noise −9.2% |"
    assert not any(line.startswith("| Laplace-L1 (RDP)") for line in lines)  # not run: left out
    assert sum(line.startswith("| *↳ paper*") for line in lines) == 1  # and so are its published numbers


def test_summary_of_a_paper_calibrated_lap2_row_states_the_interval_of_its_true_epsilon():
    from reproductions.tables import format_true_epsilon

    claim = dict(row(LAP2_PAPER, [0], [0.7]), target_epsilon=0.75, lower_bound_epsilon=0.932,
                 epsilon_by_accountant={"lap2-paper": 0.75, "lap2-rdp": 1.62})
    assert format_true_epsilon(claim) == "**0.932 – 1.62: claim refuted**"
    assert format_true_epsilon(dict(claim, lower_bound_epsilon=0.5)) == "0.5 – 1.62"
    assert format_true_epsilon(row(LAP2, [0], [0.7])) == "—"  # calibrated soundly: no bound needed


def test_printed_epsilons_round_upper_bounds_up_and_lower_bounds_down():
    """Rounded to nearest, 1.62449 (an accountant's bound) prints as 1.62, below it, and 0.93279 (a lower
    bound) as 0.933, above it."""
    from reproductions.tables import format_epsilons, format_true_epsilon

    claim = dict(row(LAP2_PAPER, [0], [0.7]), target_epsilon=0.75, lower_bound_epsilon=0.93279,
                 epsilon_by_accountant={"lap2-paper": 0.74991, "lap2-rdp": 1.62449})
    assert format_epsilons(claim) == "lap2-paper* 0.75, lap2-rdp 1.63; **true ε ≥ 0.932: claim refuted**"
    assert format_true_epsilon(claim) == "**0.932 – 1.63: claim refuted**"
    lower, upper = (float(x) for x in format_true_epsilon(dict(claim, target_epsilon=1)).split(" – "))
    assert lower <= claim["lower_bound_epsilon"] and upper >= claim["epsilon_by_accountant"]["lap2-rdp"]


def test_summaries_without_records_say_so():
    from reproductions.tables import (
        dirichlet_summary_markdown,
        finetune_summary_markdown,
        table2_summary_markdown,
    )

    assert table2_summary_markdown([], ["mnist"]) == "(no runs yet)"
    assert dirichlet_summary_markdown([], ["mnist"], [1.0]) == "(no runs yet)"
    assert finetune_summary_markdown([], ["sst2"]) == "(no runs yet)"


def test_log_axes_are_labelled_at_one_two_five_ticks_only():
    from reproductions.figures import nice_log_ticks

    assert nice_log_ticks(0.09, 9.0) == pytest.approx([0.1, 0.2, 0.5, 1, 2, 5])
    assert nice_log_ticks(1.5, 1.9) == pytest.approx([1.7])  # no 1-2-5 value inside: one label, not none


def test_figures_name_the_split_each_dataset_was_evaluated_on():
    from reproductions.figures import evaluation_split

    rows = [{"dataset": "sst2", "eval_split": "dev"}, {"dataset": "mnist"}, {"dataset": "cifar10-jpeg",
                                                                             "eval_split": None}]
    assert evaluation_split(rows, "sst2") == "dev"
    assert evaluation_split(rows, "mnist") == evaluation_split(rows, "cifar10-jpeg") == "test"
    assert evaluation_split(rows, "fashion-mnist") == "test"


def test_clipping_table_pairs_each_rule_with_table2s_flat_run_of_the_same_cell():
    from reproductions.records import aggregate
    from reproductions.tables import clipping_markdown

    def record(column, seed, accuracy, experiment="table2", **extra):
        return dict(experiment=experiment, dataset="fashion-mnist", model="cnn", mechanism=column.mechanism,
                    calibrated_with=column.calibrated_with, target_epsilon=0.88, steps_planned=5860, optimizer="adam",
                    status="ok", seed=seed, accuracy=accuracy, noise=1.0, noise_unit="sigma", lr=1e-3,
                    epsilon_by_accountant={}, steps=5860, wall_time_s=1.0, git_commit="abc", git_src_dirty=False,
                    command="dpnoise train", **extra)

    # Table II's records were written before the clipping field existed: they count as flat
    flat = aggregate([record(GAUSSIAN, s, a) for s, a in ((0, 0.80), (1, 0.78))]
                     + [record(GAUSSIAN, 0, 0.10, target_epsilon_note=None) | {"steps_planned": 20}])
    automatic = aggregate([record(GAUSSIAN, s, a, experiment="clipping", clipping="automatic")
                           for s, a in ((0, 0.81), (1, 0.77))])
    assert {row["clipping"] for row in flat} == {"flat"}
    other_model = aggregate([record(GAUSSIAN, 0, 0.5) | {"model": "mlp"}])  # another model's flat run is not paired
    text = clipping_markdown(automatic, other_model + flat)
    assert "**Table II's CNN, fashion-mnist, ε = 0.88** (T = 5860" in text
    assert "| Gaussian (RDP) | 79.00 ± 1.41 (n=2) | 79.00 ± 2.83 (n=2) | — | +0.00 ± 1.41 (ahead in 1 of 2 seeds) | — |" \
        in text  # no adaptive run: its cells are empty
    assert "| Lap2 (b from sound lap2-rdp) | — | — | — | — | — |" in text
