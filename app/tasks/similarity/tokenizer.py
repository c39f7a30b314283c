"""The one tokenizer used by training and serving of the similarity models (MODELS.md §3.1).

ASCII punctuation is deleted, text is lowercased and split on whitespace, all-digit tokens become
`<number>`, and the sentence is wrapped in `<s> ... </s>`.
"""

from __future__ import annotations

import string

SENTENCE_START = "<s>"
SENTENCE_END = "</s>"
NUMBER = "<number>"
UNKNOWN = "<unk>"
SPECIAL_TOKENS = (SENTENCE_START, SENTENCE_END, NUMBER, UNKNOWN)

_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)


def words(text: str) -> list[str]:
    """The words of a sentence, without the `<s>`/`</s>` markers."""
    return [NUMBER if word.isdigit() else word for word in text.translate(_DELETE_PUNCTUATION).lower().split()]


def tokenize(text: str) -> list[str]:
    """Tokens as the model reads them: `<s>`, the words, `</s>`."""
    return [SENTENCE_START, *words(text), SENTENCE_END]
