"""Hypothesis profiles, and one intra-op torch thread per test: on a shared 2-core machine, OpenMP threads spinning against
other processes make small convolutions up to ~100x slower than a single thread."""

import os

import pytest

try:  # hypothesis is test-only: without it, the modules that use it skip themselves (pytest.importorskip)
    from hypothesis import HealthCheck, settings
except ImportError:
    pass
else:
    # Hypothesis profiles: "ci" (default: few, derandomised examples, so CI is fast and repeatable)
    # and "thorough" (HYPOTHESIS_PROFILE=thorough: many random examples, for a long local run).
    settings.register_profile(
        "ci", max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.register_profile("thorough", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _single_torch_thread():
    try:
        import torch
    except ImportError:  # accounting tests run without torch
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
