"""Concurrency 1 (or `--connections`), this checkout against another (a baseline commit), in one run on one machine.

Both checkouts' `python -m app` and floor apps (benchmarks/floor_app.py) run side by side. Each round times bare ONNX
Runtime at batch 1, then wrk at concurrency 1, against each server in turn (the order rotating). Reported as medians
over the rounds: p50 and p10, each over bare and less its tree's floor app, p99, answers per second, and the
server's CPU time per answer.

    git worktree add /tmp/base <commit>
    python -m benchmarks.compare_trees --base /tmp/base --rounds 7 --seconds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.floor_app import ANSWERS as FLOOR_PATHS
from benchmarks.load import (
    REPO,
    Scenario,
    bare_timings_ms,
    compile_service,
    scenarios,
    start_floor_app,
    start_server,
    wrk,
)
from benchmarks.servers import children

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` and its live descendants, all their threads."""
    ticks, pending = 0, [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a child that exited meanwhile
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
            pending += children(current)
    return ticks * TICK_S


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the baseline checkout (e.g. a git worktree)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=int, default=3, help="wrk duration per server per round")
    parser.add_argument("--only", default="", help="only the scenarios whose name contains this text")
    parser.add_argument("--connections", type=int, default=1, help="wrk's connections (the scenarios of concurrency 1)")
    args = parser.parse_args()
    port = 19000 + os.getpid() % 500
    logs = Path(tempfile.gettempdir())
    trees = {"base": args.base.resolve(), "this": REPO}
    processes = {}
    try:
        for offset, (label, tree) in enumerate(trees.items()):
            compile_service(tree)
            service_port, floor_port = port + 4 * offset, port + 4 * offset + 2
            service, _ = start_server(service_port, logs / f"mnemo-compare-{label}.log", tree)
            floor = start_floor_app(floor_port, logs / f"mnemo-compare-{label}-floor.log", tree)
            processes[f"{label} service"] = (service, f"http://127.0.0.1:{service_port}")
            processes[f"{label} floor"] = (floor, f"http://127.0.0.1:{floor_port}")
        for scenario in (s for s in scenarios() if 1 in s.concurrency and args.only in s.name):
            measure(scenario, processes, args.rounds, args.seconds, args.connections)
    finally:
        for process, _ in processes.values():
            process.kill()
            process.wait(30)


def measure(scenario: Scenario, processes: dict, rounds: int, seconds: int, connections: int = 1) -> None:
    """Print one scenario's medians over `rounds` rounds (each server right after a bare ONNX Runtime timing)."""
    runs, cpu_ms, bare = defaultdict(list), defaultdict(list), []
    labels = [label for label in processes if scenario.path in FLOOR_PATHS or not label.endswith("floor")]
    for index in range(rounds):
        for label in labels[index % len(labels) :] + labels[: index % len(labels)]:
            process, url = processes[label]
            bare.append(np.percentile(bare_timings_ms(scenario.bare_single), [50, 10]))
            before = cpu_seconds(process.pid)
            result = wrk(f"{url}{scenario.path}", scenario.body, connections, seconds, 30)
            cpu_ms[label].append((cpu_seconds(process.pid) - before) * 1000 / max(result.requests, 1))
            runs[label].append((result.p50_ms, result.p10_ms, *bare[-1], result.p99_ms, result.requests / seconds))
    bare_p50, bare_p10 = np.median(bare, axis=0)
    print(
        f"\n{scenario.name}, {connections} connection(s): bare ONNX Runtime batch 1, p50 {bare_p50:.2f} ms, "
        f"p10 {bare_p10:.2f} ms (medians of {len(bare)} timings)"
    )
    print(
        "| server | p50 ms | p50 / bare | p10 ms | p10 / bare | CPU ms per answer | p50 less the floor's | "
        "p10 less the floor's | p99 ms | answers/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label in labels:
        p50, p10, bare_run_p50, bare_run_p10, p99, per_second = np.array(runs[label]).T
        cells = [np.median(p50), np.median(p50 / bare_run_p50), np.median(p10), np.median(p10 / bare_run_p10)]
        text = [
            f"{cells[0]:.2f}",
            f"{cells[1]:.2f}x",
            f"{cells[2]:.2f}",
            f"{cells[3]:.2f}x",
            f"{np.median(cpu_ms[label]):.2f}",
        ]
        floor = runs.get(label.replace("service", "floor")) if label.endswith("service") else None
        if floor is None:
            text += ["", ""]
        else:
            floor_p50, floor_p10, *_ = np.array(floor).T
            text += [f"{np.median(p50 - floor_p50):.2f}", f"{np.median(p10 - floor_p10):.2f}"]
        text += [f"{np.median(p99):.2f}", f"{np.median(per_second):.0f}"]
        print(f"| {label} | {' | '.join(text)} |", flush=True)


if __name__ == "__main__":
    main()
