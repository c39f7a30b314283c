"""Settings refuse what no limit can judge: a float setting must be a finite number, from a flag or a variable."""

from __future__ import annotations

import click
import pytest
from pydantic import ValidationError

from app.cli import settings_from
from app.core.settings import Settings, read_keys_file

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


def test_a_keys_file_saved_with_a_byte_order_mark_keeps_its_first_key(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_bytes(b"\xef\xbb\xbfkey1\r\nkey2\r\n")  # as Windows editors save UTF-8
    assert read_keys_file(keys) == ["key1", "key2"]


@pytest.mark.parametrize("keys", ["a,b\x01secret", "a,s\u00e9cret"])
def test_an_api_key_no_client_can_send_stops_startup_without_showing_it(keys: str):
    with pytest.raises(ValidationError, match="API key 2 of the list holds a control or non-ASCII character") as raised:
        Settings(api_keys=keys)
    assert "secret" not in str(raised.value.errors(include_input=False))


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_keys_file_variable_is_unset_as_an_empty_keys_variable_is(value: str, monkeypatch):
    """A config map's empty value: authentication off, not "cannot read ." (Path("") is the working directory)."""
    monkeypatch.setenv("MNEMO_API_KEYS_FILE", value)
    monkeypatch.setenv("MNEMO_API_KEYS", value)
    assert Settings().api_keys_file is None and Settings().api_keys is None
