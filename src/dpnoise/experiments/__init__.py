"""Reproduction of the seeds' experiments (``dpnoise reproduce``).

* :mod:`~dpnoise.experiments.records` -- :class:`RunSpec`, one JSON record per finished run, aggregation;
* :mod:`~dpnoise.experiments.runner` -- runs a spec as a ``dpnoise train`` command, skipping finished ones;
* :mod:`~dpnoise.experiments.plans` -- the experiments as lists of specs, and the seeds' published numbers;
* :mod:`~dpnoise.experiments.tables` / :mod:`~dpnoise.experiments.figures` -- markdown tables and PNGs;
* :mod:`~dpnoise.experiments.reports` -- regenerates an experiment's aggregate, table and figures.
"""

from dpnoise.experiments.records import RunSpec, aggregate, load_records, record_path, write_aggregate
from dpnoise.experiments.runner import run_spec, run_specs, train_argv

__all__ = [
    "RunSpec",
    "aggregate",
    "load_records",
    "record_path",
    "run_spec",
    "run_specs",
    "train_argv",
    "write_aggregate",
]
