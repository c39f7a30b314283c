"""The lock files in requirements/: hashed, complete for pyproject.toml, and one ONNX Runtime build each."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
STALE = "requirements/ is out of date with pyproject.toml: run `make lock`"


def _pins(lock: str) -> dict[str, str]:
    """Package name -> pinned version of one lock file; every pin must carry a sha256 hash."""
    text = (ROOT / "requirements" / lock).read_text()
    entries = re.findall(r"^([A-Za-z0-9._-]+)==(\S+)((?: \\\n\s+--hash=sha256:[0-9a-f]{64})+)?", text, re.MULTILINE)
    for name, _, hashes in entries:
        assert hashes, f"{lock}: {name} has no hash"
    requirement_lines = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert len(requirement_lines) == len(entries), f"{lock}: a line that is not an exact pin"
    return {canonicalize_name(name): version for name, version, _ in entries}


def _requirements(*extras: str) -> list[Requirement]:
    """The direct requirements of the project and of these extras, self-references (mnemo[cpu]) resolved."""
    found, todo, seen = [Requirement(r) for r in PROJECT["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for requirement in map(Requirement, EXTRAS[extra]):
            if canonicalize_name(requirement.name) == canonicalize_name(PROJECT["name"]):
                todo += [name for name in requirement.extras if name not in seen]
            else:
                found.append(requirement)
    return found


@pytest.mark.parametrize(
    ("lock", "extras", "left_out"),
    [
        ("serve.txt", ["cpu", "redis"], set()),
        ("gpu.txt", ["gpu", "redis"], set()),
        ("dev.txt", [name for name in EXTRAS if name != "gpu"], {"torch"}),
    ],
)
def test_each_lock_pins_every_requirement_of_its_extras_within_its_range(lock, extras, left_out):
    pins = _pins(lock)
    for requirement in _requirements(*extras):
        name = canonicalize_name(requirement.name)
        if name in left_out:
            assert name not in pins, f"{lock} must leave {name} out (README, Install)"
            continue
        assert name in pins, f"{lock} has no {name}: {STALE}"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{lock}: {name}=={pins[name]}: {STALE}"


def test_cpu_and_gpu_runtimes_are_never_in_the_same_lock():
    for lock in ("serve.txt", "dev.txt"):
        assert "onnxruntime" in _pins(lock) and "onnxruntime-gpu" not in _pins(lock)
    assert "onnxruntime-gpu" in _pins("gpu.txt") and "onnxruntime" not in _pins("gpu.txt")


def test_serving_locks_hold_orjson_and_no_pyarrow():
    for lock in ("serve.txt", "gpu.txt"):
        pins = _pins(lock)
        assert "orjson" in pins and "pyarrow" not in pins, lock
