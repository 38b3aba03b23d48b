"""Shared pytest setup: keep torch on one thread (the CPU machines are small and often busy)."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # Only when a collected test module imported torch: the runtime tier must be able to run without it,
    # and a test that checks seer_trt never imports torch must not see it imported from here.
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
