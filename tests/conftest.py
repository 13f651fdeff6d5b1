"""One intra-op torch thread per test: on a shared 2-core machine, OpenMP threads spinning against
other processes make small convolutions up to ~100x slower than a single thread."""

import pytest


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
