"""One row of BENCHMARKS.md and the markdown table that holds them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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


def write_section(path: Path, name: str, text: str) -> None:
    """Replace (or append) the section between `<!-- name:start -->` and `<!-- name:end -->` of a file."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    current = path.read_text() if path.exists() else ""
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    if start in current and end in current:
        before, rest = current.split(start, 1)
        current = before + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        current = current.rstrip("\n") + ("\n\n" if current else "") + block
    path.write_text(current)
