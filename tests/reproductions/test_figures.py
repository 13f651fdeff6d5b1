"""Figure helpers of the reproduction."""

from __future__ import annotations

import pytest

from reproductions.figures import panels, pyplot, wrap_title

LONG_TITLE = "MiniLM-L6, lora (74,498 parameters) trained, T = 1200 (paper: RoBERTa-base)"


@pytest.mark.parametrize("width", [4.0, 5.6, 11.2])
def test_a_long_title_is_wrapped_to_fit_inside_the_figure(width):
    fig, _ = panels(1, width, 3.0)
    title = fig.suptitle(wrap_title(LONG_TITLE, width))
    renderer = fig.canvas.get_renderer()
    extent = title.get_window_extent(renderer)
    figure_extent = fig.get_window_extent(renderer)
    pyplot().close(fig)
    assert figure_extent.x0 <= extent.x0 and extent.x1 <= figure_extent.x1


def test_a_short_title_stays_on_one_line_and_no_word_is_lost():
    assert wrap_title("sst2, T = 300", 5.6) == "sst2, T = 300"
    assert wrap_title(LONG_TITLE, 5.6).split() == LONG_TITLE.split()
    assert "\n" in wrap_title(LONG_TITLE, 5.6)
