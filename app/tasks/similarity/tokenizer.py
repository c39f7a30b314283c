"""The one tokenizer used by training and serving of the similarity models (MODELS.md §3.1).

Text that is not pure ASCII is first normalised so that typographic variants read like the ASCII the
models were trained on: Unicode NFKC (full-width letters, digits and punctuation become ASCII,
ligatures and compatibility forms are decomposed), then curly quotes, primes and dashes become their
ASCII counterparts, and invisible format characters (Unicode category Cf: zero-width spaces and joiners,
byte order marks, direction marks) are deleted, so "gui\u200btar" reads as "guitar". ASCII text (all
of SICK) is left exactly as it is, so the trained models see the same tokens. Then ASCII punctuation is
deleted, text is lowercased and split on whitespace, all-digit tokens become `<number>`, and the sentence
is wrapped in `<s> ... </s>`.
"""

from __future__ import annotations

import re
import string
import unicodedata

SENTENCE_START = "<s>"
SENTENCE_END = "</s>"
NUMBER = "<number>"
UNKNOWN = "<unk>"
SPECIAL_TOKENS = (SENTENCE_START, SENTENCE_END, NUMBER, UNKNOWN)

CONTROL_CHARACTERS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"  # C0 and C1 controls except tab, newline, return
FORMAT_CATEGORY = "Cf"  # Unicode's invisible format characters: no word is made of them
_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)
_TYPOGRAPHIC_TO_ASCII = str.maketrans(
    {
        **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u02bc", "'"),  # curly apostrophes and single quotes, prime
        **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb", '"'),  # curly double quotes, guillemets
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),  # hyphens, dashes, minus sign
        "\u2044": "/",  # fraction slash (NFKC writes ½ as 1⁄2)
    }
)


_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def has_control_character(text: str) -> bool:
    """True when the text holds a control character other than tab, newline and carriage return (a sentence
    with one is refused, never tokenized)."""
    return _CONTROL.search(text) is not None


def normalize(text: str) -> str:
    """Typographic and compatibility forms as ASCII where they have an ASCII equivalent, invisible format
    characters (zero-width spaces and joiners, byte order marks, direction marks) deleted; ASCII unchanged."""
    if text.isascii():
        return text
    text = unicodedata.normalize("NFKC", text).translate(_TYPOGRAPHIC_TO_ASCII)
    return "".join(character for character in text if unicodedata.category(character) != FORMAT_CATEGORY)


def words(text: str) -> list[str]:
    """The words of a sentence, without the `<s>`/`</s>` markers."""
    cleaned = normalize(text).translate(_DELETE_PUNCTUATION).lower()
    return [NUMBER if word.isdigit() else word for word in cleaned.split()]


def tokenize(text: str) -> list[str]:
    """Tokens as the model reads them: `<s>`, the words, `</s>`."""
    return [SENTENCE_START, *words(text), SENTENCE_END]
