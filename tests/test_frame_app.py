"""create_app: both task routers with their preparers; settings from MNEMO_*."""

from __future__ import annotations

import pytest

from app.main import TASK_ROUTERS, create_app
from app.settings import DEFAULT_ARTIFACTS_DIR, Settings


def test_both_task_routers_are_included_with_their_preparers():
    assert {router.TASK for router in TASK_ROUTERS} == {"similarity", "knowledge-trace"}
    paths = set(create_app(Settings(provider="cpu")).openapi()["paths"])
    assert {"/similarity", "/similarity/batch", "/knowledge-trace", "/health", "/ready", "/models", "/metrics"} <= paths


def test_settings_come_from_mnemo_variables(monkeypatch, tmp_path):
    assert Settings().artifacts_dir == DEFAULT_ARTIFACTS_DIR and DEFAULT_ARTIFACTS_DIR.name == "artifacts"
    for name, value in {
        "ARTIFACTS_DIR": str(tmp_path),
        "HOST": "0.0.0.0",
        "PORT": "9001",
        "PROVIDER": "cuda",
        "INTRA_OP_THREADS": "3",
        "LOG_LEVEL": "debug",
        "LOG_FORMAT": "json",
        "MAX_BODY_BYTES": "2048",
        "ON_MODEL_ERROR": "skip",
    }.items():
        monkeypatch.setenv(f"MNEMO_{name}", value)
    settings = Settings()
    assert (settings.artifacts_dir, settings.host, settings.port, settings.provider) == (
        tmp_path,
        "0.0.0.0",
        9001,
        "cuda",
    )
    assert (settings.intra_op_threads, settings.log_level, settings.log_format) == (3, "debug", "json")
    assert (settings.max_body_bytes, settings.on_model_error) == (2048, "skip")
    monkeypatch.setenv("MNEMO_PROVIDER", "gpu")
    with pytest.raises(ValueError, match="provider"):
        Settings()
