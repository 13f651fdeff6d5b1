"""Figures drawn from the library's own numbers (matplotlib is imported when a figure is drawn).

* :func:`walls_figure` -- the privacy walls of the Gaussian, Lap2 and published Lap2 accountants.
"""

from dpnoise.plotting.walls import walls_figure

__all__ = ["walls_figure"]
