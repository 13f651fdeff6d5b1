"""One intra-op thread per test: on a shared 2-core machine, OpenMP threads that spin against other
processes make small convolutions ~100x slower than a single thread."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
