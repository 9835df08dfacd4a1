"""What the tests of the chapters' live experiments share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for a test. Under the hog every core is busy, and a second thread would spend
    most of each operation waiting for the first to be scheduled (a short test would take minutes);
    the guard reads the threads in use, so it judges the runs just as it would in the notebook.
    A module asks for it with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
