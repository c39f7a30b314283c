"""The console examples of the docs: every ```console block of a markdown file is a session of `$ command` lines,
each followed by the output it printed. The tests run each command against a live server and compare the shape of
what it prints with what the docs show."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

BLOCK = re.compile(r"^```console\n(.*?)^```$", re.MULTILINE | re.DOTALL)
DOCS_URL = "localhost:8000"


class TextLine(str):
    """A line of output that is not JSON: compared as it is."""


@dataclass
class Example:
    command: str  # as the docs show it, continuation lines joined
    output: str  # what the docs show it printed ("" for none)
    line: int  # of the command in the file, for messages


def examples(markdown: Path) -> list[Example]:
    """The commands of every ```console block, in order; `$ #` lines are comments and are skipped."""
    text = markdown.read_text()
    found = []
    for block in BLOCK.finditer(text):
        first_line = text.count("\n", 0, block.start()) + 2
        command: list[str] = []
        output: list[str] = []
        start = 0
        for number, line in enumerate(block.group(1).splitlines(), first_line):
            continued = command and command[-1].endswith("\\")
            if line.startswith("$ ") or continued:
                if line.startswith("$ ") and command and not continued:
                    found.append(Example("\n".join(command), "\n".join(output), start))
                    command, output = [], []
                if not command:
                    start = number
                command.append(line.removeprefix("$ "))
            else:
                output.append(line)
        if command:
            found.append(Example("\n".join(command), "\n".join(output), start))
    return [example for example in found if not example.command.startswith("#")]


def run(example: Example, url: str, cwd: Path) -> str:
    """Run a command with bash in `cwd`, against `url` instead of the docs' localhost:8000; what it printed."""
    command = example.command.replace(DOCS_URL, url.removeprefix("http://"))
    done = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"line {example.line}: {example.command!r} exited {done.returncode}: {done.stderr}"
    return done.stdout.rstrip("\n")


def parsed(output: str) -> list[object]:
    """An output as JSON values: the whole text, else one per line, else the line as a `TextLine`."""
    try:
        return [json.loads(output)] if output.strip() else []
    except json.JSONDecodeError:
        pass
    values: list[object] = []
    for line in filter(str.strip, output.splitlines()):
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError:
            values.append(TextLine(line.strip()))
    return values


def shape(value: object) -> object:
    """What a JSON value looks like without its values: keys, list lengths and types; a `TextLine` as it is."""
    if isinstance(value, TextLine):
        return str(value)
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return "number"
    return "string"
