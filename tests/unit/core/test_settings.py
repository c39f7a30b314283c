"""Settings refuse what no limit can judge: a float setting must be a finite number, from a flag or a variable."""

from __future__ import annotations

import click
import pytest
from pydantic import ValidationError

from app.cli import settings_from
from app.core.settings import Settings

FLOAT_SETTINGS = [name for name, field in Settings.model_fields.items() if field.annotation is float]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("name", FLOAT_SETTINGS)
def test_a_float_setting_that_is_not_finite_is_refused_as_such(name: str, value: str, monkeypatch):
    monkeypatch.setenv(f"MNEMO_{name.upper()}", value)
    with pytest.raises(ValidationError, match="Input should be a finite number"):
        Settings()
    monkeypatch.delenv(f"MNEMO_{name.upper()}")
    with pytest.raises(click.UsageError, match=f"--{name.replace('_', '-')}: Input should be a finite number"):
        settings_from({name: float(value)})


def test_every_float_setting_is_checked():
    assert {"request_timeout_s", "max_wait_ms", "error_log_window_s", "worker_stall_s"} <= set(FLOAT_SETTINGS)
