"""Shared fixtures.

Serving tests need only the serving and dev dependencies: they run the real app on the committed
models (`client`) or on toy ONNX graphs (`toy_artifacts`). The pipeline fixture `tiny_artifacts`
(train -> export -> manifest on generated data) needs the train extra (torch) and skips without it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.settings import DEFAULT_ARTIFACTS_DIR
from tests.helpers import app_client
from tests.synthetic_data import write_sick, write_synthetic_kt
from tests.toy_model import OTHER_TASK, toy_entry, write_toy_artifacts

# The training tests import torch at module level: without the train extra they are not collected.
collect_ignore = [] if importlib.util.find_spec("torch") else ["training/test_dkvmn.py", "training/test_rmc.py"]

KT_MODEL = "dkvmn-synthetic"
SIM_MODEL = "rmc-vlmp-sick"
FLMP_MODEL = "rmc-flmp-sick"
MSRP_MODEL = "rmc-vlmp-msrp"
COMMITTED = DEFAULT_ARTIFACTS_DIR


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train → export → manifest, in seconds, on generated data: the whole offline pipeline for real."""
    pytest.importorskip("torch", reason="the training pipeline needs the train extra")
    from export import kt as export_kt
    from export import similarity as export_similarity
    from models import train_kt, train_sim

    root = tmp_path_factory.mktemp("pipeline")
    kt_data = write_synthetic_kt(root / "kt")
    sick_data = write_sick(root / "sick")
    artifacts = root / "artifacts"
    runs = root / "runs"
    kt_run = ["--dataset", "synthetic-v0", "--data-dir", str(kt_data), "--epochs", "2"]
    train_kt.main([*kt_run, "--out", str(runs / "synthetic-v0"), "--no-progress"])
    export_kt.main(
        ["--run", str(runs / "synthetic-v0"), "--name", KT_MODEL, "--artifacts", str(artifacts), "--default"]
    )
    tiny = ["--heads", "2", "--head-size", "8", "--fc-dim", "16", "--epochs", "1", "--no-progress"]
    tiny += ["--data-dir", str(sick_data)]
    train_sim.main(["--pointer", "vlmp", "--out", str(runs / "vlmp"), *tiny])
    export_similarity.main(
        ["--run", str(runs / "vlmp"), "--name", SIM_MODEL, "--artifacts", str(artifacts), "--default"]
    )
    train_sim.main(["--pointer", "flmp", "--out", str(runs / "flmp"), *tiny])
    export_similarity.main(["--run", str(runs / "flmp"), "--name", FLMP_MODEL, "--artifacts", str(artifacts)])
    return artifacts


@pytest.fixture
def artifacts_copy(tmp_path: Path) -> Path:
    """A private copy of the committed artifacts that a test may tamper with."""
    return Path(shutil.copytree(COMMITTED, tmp_path / "artifacts"))


@pytest.fixture(scope="session", autouse=True)
def state_store_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Apps and servers started by the tests keep student state in a tmp dir, never in the checkout's state/."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MNEMO_STATE_URL", f"sqlite://{tmp_path_factory.mktemp('state') / 'students.db'}")
        yield


@pytest.fixture(scope="session")
def client() -> Iterator[TestClient]:
    """The real app over HTTP (TestClient) on the committed models, CPU provider."""
    with app_client(COMMITTED) as test_client:
        yield test_client


def manifest_models(artifacts: Path) -> list[dict]:
    return json.loads((artifacts / "manifest.json").read_text())["models"]


# -- the frame's own fixtures: toy ONNX models built with onnx.helper (tests/toy_model.py) -------------
TOY_NAMES = ("toy-a", "toy-b", "toy-kt")


@pytest.fixture
def toy_artifacts(tmp_path: Path) -> Path:
    """toy-a (default) and toy-b of the toy task, toy-kt of the other task; private to the test."""
    entries = [toy_entry("toy-a", default=True), toy_entry("toy-b"), toy_entry("toy-kt", task=OTHER_TASK)]
    return write_toy_artifacts(tmp_path / "toy-artifacts", entries)


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
    names = ("mnemo.access", "mnemo.providers", "mnemo.registry", "mnemo.errors", "mnemo.server")
    for name in names:
        logging.getLogger(name).addHandler(handler)
    yield handler
    for name in names:
        logging.getLogger(name).removeHandler(handler)
