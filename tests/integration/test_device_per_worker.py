"""MNEMO_CUDA_DEVICE_ID=3,5 with two gunicorn workers: worker number i takes the i-th id, and a replacement takes
the number, so the device, of the worker it replaces. Run for real (`python -m app`); the provider is CPU here, so
the device is read from the workers' log lines."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from tests.conftest import COMMITTED
from tests.helpers import Server, running_server

pytestmark = pytest.mark.slow
PLACED = re.compile(r"worker (\d+) is number (\d+): CUDA device (\d+)")


def _placements(server: Server, count: int, timeout_s: float = 120) -> list[tuple[int, int, str]]:
    """(pid, number, device) of the first `count` workers that logged their device."""
    deadline = time.monotonic() + timeout_s
    while True:
        messages = [json.loads(line)["message"] for line in server.output if line.startswith("{")]
        found = [(int(m[1]), int(m[2]), m[3]) for m in map(PLACED.fullmatch, messages) if m]
        if len(found) >= count:
            return found
        assert server.process.poll() is None and time.monotonic() < deadline, server.output[-20:]
        time.sleep(0.1)


def test_workers_are_spread_over_the_listed_devices_and_a_replacement_keeps_its_device():
    settings = {"MNEMO_WORKERS": "2", "MNEMO_CUDA_DEVICE_ID": "3,5", "MNEMO_MODELS": "dkvmn-synthetic"}
    with running_server(COMMITTED, **settings) as server:
        first = _placements(server, 2)
        assert sorted((number, device) for _, number, device in first) == [(0, "3"), (1, "5")]
        pid = next(pid for pid, number, _ in first if number == 0)
        os.kill(pid, signal.SIGKILL)
        replacement = _placements(server, 3)[2]
        assert replacement[0] != pid and replacement[1:] == (0, "3")
