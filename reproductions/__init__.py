"""Reproduction of the experiments of the two papers dpnoise implements (``python -m reproductions``).

Lap2 (Mohammady et al., "Lap2: Revisiting Laplace DP-SGD for High Dimensions via Majorization
Theory") and Dirichlet-mechanism training; see README.md in this folder.  This folder is not part
of the installed ``dpnoise`` package: it uses the library like any other user.

* :mod:`~reproductions.records` -- :class:`RunSpec`, one JSON record per finished run, aggregation;
* :mod:`~reproductions.runner` -- runs a spec with ``dpnoise.training.train_private`` (its record states the
  equivalent ``dpnoise train`` command), skipping finished ones;
* :mod:`~reproductions.plans` -- the experiments as lists of specs, and the seeds' published numbers;
* :mod:`~reproductions.tables` / :mod:`~reproductions.figures` -- markdown tables and PNGs;
* :mod:`~reproductions.reports` -- regenerates an experiment's aggregate, table and figures.
"""
