"""`python -m benchmarks.gpu` on this machine, which has no GPU: it says so in one line and exits 2; its CPU dry run
measures every committed graph; it imports neither torch nor httpx (the GPU environment is requirements/gpu.txt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import committed_graphs, rows_within

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_DEV_PACKAGES = (
    "import runpy, sys; sys.modules.update(torch=None, httpx=None); "  # an import of either now fails
    "runpy.run_module('benchmarks.gpu', run_name='__main__')"
)


def _run(*arguments: str, timeout: float = 120) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", WITHOUT_DEV_PACKAGES, *arguments]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_without_a_gpu_it_exits_2_with_one_line_saying_what_is_missing():
    result = _run()
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("benchmarks.gpu: ") and "CUDAExecutionProvider" in line and "requirements/gpu.txt" in line


@pytest.mark.slow
def test_the_cpu_dry_run_measures_every_graph_and_writes_its_section(tmp_path):
    output = tmp_path / "BENCHMARKS.md"
    output.write_text("# Benchmarks\n")
    result = _run("--cpu-only", "--batches", "1,2", "--seconds", "0.01", "--skip-service", "--output", str(output))
    assert result.returncode == 0, result.stderr[-2000:]
    text = output.read_text()
    assert text.startswith("# Benchmarks\n") and "<!-- gpu:start -->" in text and "<!-- gpu:end -->" in text
    for graph in committed_graphs():
        assert f"| {graph} | " in text
    parity = text.split("Largest output difference")[1]
    assert all(f"| {graph} | 0.0e+00 |" in parity for graph in committed_graphs())  # CPU against CPU


def test_rows_per_run_follow_the_measured_bytes_per_row_and_the_limit():
    """The issue's measurement: about 23 MB per 200-step DKVMN history; 5.9 GB held 256 of them."""
    assert rows_within(4096 * 2**20, 23e6) == 186
    assert rows_within(int(5.9e9), 23e6) == 256
    assert rows_within(10 * 2**20, 23e6) == 1  # never below one row: a row that does not fit is split to a 503
