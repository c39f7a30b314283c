"""One row of BENCHMARKS.md and the markdown table that holds them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """A measured latency: what ran, on what input, its median and p99 in milliseconds."""

    model: str
    what: str
    setting: str
    median_ms: float
    p99_ms: float | None = None
    note: str = ""


def to_markdown(rows: list[Row]) -> str:
    """A markdown table of the rows, in the order given."""
    lines = [
        "| model | what | setting | median ms | p99 ms | note |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        p99 = f"{row.p99_ms:.2f}" if row.p99_ms is not None else "–"
        lines.append(f"| {row.model} | {row.what} | {row.setting} | {row.median_ms:.2f} | {p99} | {row.note} |")
    return "\n".join(lines) + "\n"
