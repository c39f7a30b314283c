"""Run every latency benchmark and write one markdown table to BENCHMARKS.md (`make bench`)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
from pathlib import Path

from benchmarks import knowledge_trace, similarity, students
from benchmarks.table import Row, to_markdown, write_section


def _header() -> str:
    """Where and when the numbers were measured."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpus = len(os.sched_getaffinity(0))
    return (
        f"Measured {when} on {platform.machine()} with {cpus} usable CPU(s), ONNX Runtime CPU provider, "
        "all rows in one run of `make bench` (the machine is shared: compare rows of one run, "
        "not runs).\n\n"
    )


def main() -> None:
    """Collect the rows of both tasks (and the per-student appends) and write the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args()
    rows: list[Row] = [*knowledge_trace.rows(), *students.rows(), *similarity.rows()]
    write_section(args.output, "latency", "## Latency (`make bench`)\n\n" + _header() + to_markdown(rows))
    print(to_markdown(rows))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
