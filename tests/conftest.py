"""Shared fixtures: tiny models trained, exported and listed in a manifest by the project's own commands."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from export import kt as export_kt
from export import similarity as export_similarity
from models import train_kt, train_sim
from tests.synthetic_data import write_sick, write_synthetic_kt
from tests.toy_model import toy_entry, write_toy_artifacts

KT_MODEL = "dkvmn-synthetic"
SIM_MODEL = "rmc-vlmp-sick"
FLMP_MODEL = "rmc-flmp-sick"


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train → export → manifest, in seconds, on generated data: the whole offline pipeline for real."""
    root = tmp_path_factory.mktemp("pipeline")
    kt_data = write_synthetic_kt(root / "kt")
    sick_data = write_sick(root / "sick")
    artifacts = root / "artifacts"
    runs = root / "runs"
    train_kt.main(
        [
            "--dataset",
            "synthetic-v0",
            "--data-dir",
            str(kt_data),
            "--epochs",
            "2",
            "--out",
            str(runs / "synthetic-v0"),
            "--no-progress",
        ]
    )
    export_kt.main(
        ["--run", str(runs / "synthetic-v0"), "--name", KT_MODEL, "--artifacts", str(artifacts), "--default"]
    )
    tiny = [
        "--heads",
        "2",
        "--head-size",
        "8",
        "--fc-dim",
        "16",
        "--epochs",
        "1",
        "--no-progress",
        "--data-dir",
        str(sick_data),
    ]
    train_sim.main(["--pointer", "vlmp", "--out", str(runs / "vlmp"), *tiny])
    export_similarity.main(
        ["--run", str(runs / "vlmp"), "--name", SIM_MODEL, "--artifacts", str(artifacts), "--default"]
    )
    train_sim.main(["--pointer", "flmp", "--out", str(runs / "flmp"), *tiny])
    export_similarity.main(["--run", str(runs / "flmp"), "--name", FLMP_MODEL, "--artifacts", str(artifacts)])
    return artifacts


@pytest.fixture
def artifacts_copy(tiny_artifacts: Path, tmp_path: Path) -> Path:
    """A private copy a test may tamper with."""
    return Path(shutil.copytree(tiny_artifacts, tmp_path / "artifacts"))


@pytest.fixture(scope="session")
def client(tiny_artifacts: Path) -> Iterator[TestClient]:
    """The real app over HTTP (TestClient) on the tiny models, CPU provider."""
    settings = Settings(artifacts_dir=tiny_artifacts, provider="cpu", intra_op_threads=1)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def manifest_models(artifacts: Path) -> list[dict]:
    return json.loads((artifacts / "manifest.json").read_text())["models"]


# -- the frame's own fixtures: toy ONNX models built with onnx.helper (tests/toy_model.py) -------------
TOY_NAMES = ("toy-a", "toy-b", "toy-kt")


@pytest.fixture
def toy_artifacts(tmp_path: Path) -> Path:
    """toy-a (default) and toy-b of the toy task, toy-kt of the other task; private to the test."""
    entries = [toy_entry("toy-a", default=True), toy_entry("toy-b"), toy_entry("toy-kt", task="knowledge-trace")]
    return write_toy_artifacts(tmp_path / "toy-artifacts", entries)


def toy_settings(artifacts: Path, **overrides) -> Settings:
    """CPU, one thread, the given artifacts; any setting can be overridden."""
    return Settings(**{"artifacts_dir": artifacts, "provider": "cpu", "intra_op_threads": 1, **overrides})


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, logger: str) -> list[str]:
        return [r.getMessage() for r in self.records if r.name == logger]


@pytest.fixture
def mnemo_logs() -> Iterator[_Records]:
    """Log records of the service's loggers (they do not propagate to the root, so caplog misses them)."""
    handler = _Records()
    names = ("mnemo.access", "mnemo.providers", "mnemo.registry", "mnemo.errors")
    for name in names:
        logging.getLogger(name).addHandler(handler)
    yield handler
    for name in names:
        logging.getLogger(name).removeHandler(handler)
