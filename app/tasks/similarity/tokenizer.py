"""The one tokenizer of training and serving of the similarity models (MODELS.md §3.1), ASCII-normalising first."""

from __future__ import annotations

import re
import string
import unicodedata

SPECIAL_TOKENS = SENTENCE_START, SENTENCE_END, NUMBER, UNKNOWN = ("<s>", "</s>", "<number>", "<unk>")

CONTROL_CHARACTERS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"  # C0 and C1 controls except tab, newline, return
# Unicode's Default_Ignorable_Code_Point ranges beyond Cf: fillers and variation selectors that render as nothing
DEFAULT_IGNORABLE = (
    "034F 115F..1160 17B4..17B5 180B..180F 3164 FE00..FE0F FFA0 FFF0..FFF8 1BCA0..1BCA3 1D173..1D17A E0000..E0FFF"
)
_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)
_TYPOGRAPHIC_TO_ASCII = str.maketrans(
    {
        **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u02bc", "'"),  # curly apostrophes and single quotes, prime
        **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb", '"'),  # curly double quotes, guillemets
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),  # hyphens, dashes, minus sign
        "\u2044": "/",  # fraction slash (NFKC writes ½ as 1⁄2)
        "\u2800": " ",  # braille pattern blank: renders as a space, is not Unicode whitespace
    }
)
CONTROL_CHARACTER = re.compile(f"[{CONTROL_CHARACTERS}]")  # a text with one is refused
# _TO_ASCII translates text after NFKC: invisible characters (Cf, DEFAULT_IGNORABLE) deleted, typographic as ASCII
_INVISIBLE = [code for code in range(0x20000) if unicodedata.category(chr(code)) == "Cf"] + [
    code
    for low, _, high in (part.partition("..") for part in DEFAULT_IGNORABLE.split())
    for code in range(int(low, 16), int(high or low, 16) + 1)
]
_TO_ASCII = dict.fromkeys(_INVISIBLE) | _TYPOGRAPHIC_TO_ASCII


def words(text: str) -> list[str]:
    """The words of a sentence, without the `<s>`/`</s>` markers nor words of combining marks alone (no letter)."""
    normalized = text if text.isascii() else unicodedata.normalize("NFKC", text).translate(_TO_ASCII)
    cleaned = normalized.translate(_DELETE_PUNCTUATION).lower()
    return [
        NUMBER if word.isdigit() else word
        for word in cleaned.split()
        if word.isascii() or not all(unicodedata.category(character)[0] == "M" for character in word)
    ]


def tokenize(text: str) -> list[str]:
    """Tokens as the model reads them: `<s>`, the words, `</s>`."""
    return [SENTENCE_START, *words(text), SENTENCE_END]
