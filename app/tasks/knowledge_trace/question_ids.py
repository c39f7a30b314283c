"""A model's own question ids (asset `question_ids` of a model trained on a user's CSV: the id of question k
at index k-1); models without it use the numbers 1..n_questions as ids."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from app.core.errors import MAX_LISTED_ERRORS, InvalidInput

QuestionKey = int | str


def item_location(field: tuple[str, ...], index: int) -> tuple[str | int, ...]:
    """Where item `index` of a question field is: `next_questions[i]`, or `interactions[i].question`."""
    return (*field, index) if field[-1] == "next_questions" else (*field, index, "question")


def refuse_items(field: tuple[str, ...], indexes: Sequence[int], message: Callable[[int], str]) -> NoReturn:
    """One 422 naming each refused item of a question field (the first MAX_LISTED_ERRORS) and counting all."""
    errors = [InvalidInput(item_location(field, index), message(index)) for index in indexes[:MAX_LISTED_ERRORS]]
    raise InvalidInput.joined(errors, count=len(indexes))


@dataclass(frozen=True)
class QuestionIds:
    """The user's id of each question number (`ids[k - 1]`), and the number of each id."""

    ids: tuple[QuestionKey, ...]
    numbers: dict[QuestionKey, int]

    @classmethod
    def from_asset(cls, asset: np.ndarray, n_questions: int) -> QuestionIds:
        """Check the asset: one unique id per question, all integers or all strings."""
        if asset.shape != (n_questions,):
            raise ValueError(f"question_ids has shape {asset.shape}, not ({n_questions},)")
        if asset.dtype.kind not in "iU":
            raise ValueError(f"question_ids must hold integers or strings, not {asset.dtype}")
        ids = tuple(asset.tolist())
        numbers = {question: number for number, question in enumerate(ids, start=1)}
        if len(numbers) != len(ids):
            raise ValueError("question_ids repeats an id")
        return cls(ids, numbers)

    def numbers_of(self, values: Sequence[QuestionKey], field: tuple[str, ...], model: str) -> np.ndarray:
        """The question numbers of `values`; unknown ids are a 422 naming each item (the first MAX_LISTED_ERRORS)."""
        numbers = [self.numbers.get(value, 0) for value in values]
        unknown = [index for index, number in enumerate(numbers) if number == 0]
        if unknown:
            kind = "integers" if isinstance(self.ids[0], int) else "strings"
            refuse_items(
                field,
                unknown,
                lambda index: (
                    f"question {values[index]!r} is not a question of model {model} (its question ids are "
                    f"{kind}; GET /models/{model}/questions lists them)"
                ),
            )
        return np.array(numbers, dtype=np.int64)
