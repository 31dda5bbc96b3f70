"""What every test shares: each test leaves torch's thread count as it found it.

Benchmarks run in-process by their tests time one thread (``--threads 1``); a test that compares a child
process's outputs with this process's bit for bit (remote code, pipelines) needs both to add in the same
order, which the number of threads decides."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
