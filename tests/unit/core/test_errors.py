"""What error messages show of client text: `printable` escapes what a terminal or a page would not show as is."""

from __future__ import annotations

import pytest

from app.core.errors import printable
from app.core.manifest import ModelLoadError, chosen


def test_printable_escapes_controls_bidi_overrides_and_lone_surrogates_and_keeps_other_text() -> None:
    assert printable("\u202eevil\x00 \u2066x\u2069\ud800\n") == "\\u202eevil\\x00 \\u2066x\\u2069\\ud800\\n"
    assert printable("café déjà 字 \U0001f600") == "café déjà 字 \U0001f600"
    assert printable("x" * 400) == "x" * 300


def test_an_unknown_model_name_given_to_serve_is_shown_escaped() -> None:
    says = r"^--models/MNEMO_MODELS names \\u202ex, which the manifest does not have"
    with pytest.raises(ModelLoadError, match=says):
        chosen([], ["\u202ex"])
