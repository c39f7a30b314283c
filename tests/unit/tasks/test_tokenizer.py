"""The similarity tokenizer: typographic and full-width forms read like ASCII, and SICK reads exactly as before."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest

from app.tasks.similarity.tokenizer import NUMBER, tokenize
from models.sick_data import read_split

SICK_DIR = Path(os.environ.get("MNEMO_DATA_DIR", Path(__file__).resolve().parents[4] / "shared" / "data")) / "sick"
SICK_FILES = ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt")


def tokenize_before_normalisation(text: str) -> list[str]:
    """The tokenizer as the committed models were trained with it (before Unicode normalisation)."""
    cleaned = text.translate(str.maketrans("", "", string.punctuation)).lower().split()
    return ["<s>", *(NUMBER if word.isdigit() else word for word in cleaned), "</s>"]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("It\u2019s a \u201cgood\u201d day", ["its", "a", "good", "day"]),  # curly apostrophe and quotes
        ('It\'s a "good" day', ["its", "a", "good", "day"]),
        ("\u2018quoted\u2019 \u201equoted\u201f", ["quoted", "quoted"]),
        ("\uff21 \uff4d\uff41\uff4e\uff01 \uff11\uff12", ["a", "man", NUMBER]),  # full-width letters, digits, !
        ("well\u2014known \u2013 ok", ["wellknown", "ok"]),  # em and en dashes read like hyphens
        ("\ufb01ne caf\u00e9", ["fine", "café"]),  # a ligature is decomposed, an accented letter kept
        ("x\u00a0y", ["x", "y"]),  # no-break space
        ("\u00bdcup", ["12cup"]),  # NFKC: the fraction becomes 1/2, then the slash is punctuation
        ("gui\u200btar \ufeffnice\u200f", ["guitar", "nice"]),  # zero-width space, byte order mark, direction mark
        ("\u200b \u2060", []),  # format characters only: no word
        ("\u3164 \ufe0f\u034f \U000e0100", []),  # Hangul filler, variation selectors, grapheme joiner: no word
        ("heart\ufe0f ok", ["heart", "ok"]),
        ("\u2800 \u2800\u2800", []),  # braille blank: renders as a space
        ("a\u2800dog", ["a", "dog"]),
        ("\u0301 \u0300\u0308 \u20e3", []),  # combining and enclosing marks with no letter: no word
        ("a \u0301 dog \u00b4", ["a", "dog"]),  # NFKC writes the spacing acute as a space and U+0301
        ("cafe\u0301 \u0301x", ["café", "\u0301x"]),  # a mark on a letter stays
    ],
)
def test_typographic_and_compatibility_forms_read_like_ascii(text, tokens):
    assert tokenize(text) == ["<s>", *tokens, "</s>"]


@pytest.mark.skipif(
    not (SICK_DIR / SICK_FILES[0]).is_file() and not os.environ.get("CI"), reason="SICK is not in MNEMO_DATA_DIR"
)
def test_every_sick_sentence_gives_exactly_the_tokens_the_models_were_trained_on():
    sentences = 0
    for name in SICK_FILES:
        for pair in read_split(SICK_DIR / name):
            for sentence in (pair.sentence_a, pair.sentence_b):
                assert tokenize(sentence) == tokenize_before_normalisation(sentence), sentence
                sentences += 1
    assert sentences == 2 * 9927  # 4,500 train + 500 trial + 4,927 test pairs
