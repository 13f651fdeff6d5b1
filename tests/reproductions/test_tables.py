"""Paired comparisons between Table II columns (no training: aggregated rows built by hand)."""

from __future__ import annotations

import pytest

from reproductions.plans import TABLE2_COLUMNS
from reproductions.records import paired_difference
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
