"""The knowledge-tracing service, transport-free: validate, chunk, run through the batcher, decode. DKVMN's memory
slots are latent concepts that explain its answers; the DKT baseline (`metadata.family` dkt) has none. A history
longer than `seqlen` runs in chunks, each from the recurrent state the previous one ended with."""

from __future__ import annotations

import asyncio
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn

import numpy as np

from app.core.errors import MAX_LISTED_ERRORS, InvalidInput, each_checked
from app.core.manifest import positive_int
from app.runtime.batcher import Chain
from app.runtime.collate import Feeds
from app.runtime.model import ServedModel

TASK_NAME = "knowledge-trace"
SKILL_NAMED_DATASETS = frozenset({"assist2009"})  # question names are skill names: concepts get readable labels
TOP_SKILLS = 3
NEXT_ITEM_NUMBERS = 10  # a `next` item (a dict) takes about as long to build and render as 10 array numbers
QuestionKey = int | str
History = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # questions, correct, memory (None: the initial state)


@dataclass(frozen=True)
class Family:
    """A graph family: the names of its recurrent state, and whether memory slots (concepts) explain its answers."""

    name: str
    state_input: str
    state_output: str
    has_concepts: bool


DKVMN = Family("dkvmn", "mv_in", "mv_out", has_concepts=True)
DKT = Family("dkt", "state_in", "state_out", has_concepts=False)
FAMILIES = {family.name: family for family in (DKVMN, DKT)}


@dataclass(frozen=True)
class QuestionIds:
    """A model's own question ids (asset `question_ids`, from `mnemo train kt`): `ids[k - 1]` names question k."""

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


@dataclass(frozen=True)
class KnowledgeTraceState:
    """What requests need from one knowledge-tracing model, checked at startup (concept fields None for DKT)."""

    family: Family
    n_questions: int
    seqlen: int
    max_interactions: int
    max_histories: int  # rows of one Open Inference Protocol request (each with its state in and out)
    init_memory: np.ndarray  # the state a history starts from: DKVMN [N, d_v], DKT [2, S] float32
    names: tuple[str | None, ...] | None  # question names where the data set has them
    question_ids: QuestionIds | None  # the user's own ids; None: ids are 1..n_questions
    n_concepts: int | None = None
    concepts: np.ndarray | None = None  # [n_questions]: each question's main concept
    concept_skills: tuple[tuple[str, ...], ...] | None = None  # per concept: top skill names (skill-named data sets)


@dataclass(frozen=True)
class Trace:
    """Per-step predictions [T], correlation weights [T,N], mastery [T+1,N] (None without memory slots),
    and the final state (DKVMN memory [N,d_v], DKT LSTM state [2,S])."""

    predictions: np.ndarray
    attention: np.ndarray | None
    mastery: np.ndarray | None
    memory: np.ndarray


def prepare(model: ServedModel) -> KnowledgeTraceState:
    """Sizes from the manifest, checked against the assets and the graph."""
    metadata = model.entry.metadata
    family = FAMILIES.get(metadata.get("family", DKVMN.name))
    if family is None:
        raise ValueError(f"metadata.family is {metadata.get('family')!r}; known: {', '.join(FAMILIES)}")
    inputs = {node.name: node for node in model.session.get_inputs()}
    outputs = {node.name for node in model.session.get_outputs()}
    if family.state_input not in inputs or family.state_output not in outputs:
        raise ValueError(
            f"a {family.name} graph takes {family.state_input} and gives {family.state_output}; this one takes "
            f"{', '.join(sorted(inputs))} and gives {', '.join(sorted(outputs))}"
        )
    n_questions, seqlen = (positive_int(metadata, key) for key in ("n_questions", "seqlen"))
    raw_names = model.assets.get("question_names")
    names = tuple(str(name) or None for name in raw_names) if raw_names is not None else None
    if names is not None and len(names) != n_questions:
        raise ValueError(f"question_names has {len(names)} rows, not {n_questions}")
    raw_ids = model.assets.get("question_ids")
    common = {
        "question_ids": None if raw_ids is None else QuestionIds.from_asset(np.asarray(raw_ids), n_questions),
        "family": family,
        "n_questions": n_questions,
        "seqlen": seqlen,
        "max_interactions": positive_int(model.entry.limits, "max_interactions"),
        "max_histories": positive_int(model.entry.limits, "max_histories"),
        "names": names,
    }
    if not family.has_concepts:  # a DKT history starts from zeros, shaped as the graph's state input
        shape = inputs[family.state_input].shape[1:]
        if len(shape) != 2 or not all(isinstance(size, int) and size > 0 for size in shape):
            raise ValueError(f"{family.state_input} must have a fixed [2, S] shape after the batch, not {shape}")
        return KnowledgeTraceState(**common, init_memory=np.zeros(shape, dtype=np.float32))
    n_concepts = positive_int(metadata, "n_concepts")
    concepts = np.asarray(model.assets["question_concepts"]).astype(np.int64)
    if concepts.shape != (n_questions,):
        raise ValueError(f"question_concepts has shape {concepts.shape}, not ({n_questions},)")
    init_memory = np.asarray(model.assets["init_memory"], dtype=np.float32)
    if init_memory.ndim != 2 or init_memory.shape[0] != n_concepts:
        raise ValueError(f"init_memory has shape {init_memory.shape}, not ({n_concepts}, d_v)")
    skill_named = names is not None and metadata.get("dataset") in SKILL_NAMED_DATASETS
    return KnowledgeTraceState(
        **common,
        init_memory=init_memory,
        n_concepts=n_concepts,
        concepts=concepts,
        concept_skills=_concept_skills(model, init_memory, names) if skill_named else None,
    )


def _concept_skills(
    model: ServedModel, init_memory: np.ndarray, names: tuple[str | None, ...]
) -> tuple[tuple[str, ...], ...]:
    """Per concept, the names (without CSV quotes) of the TOP_SKILLS questions with the largest correlation weight
    on it: one step per question from the initial memory, as the weights depend on the key memory only."""
    weights = model.run(step_feeds(DKVMN, init_memory, np.arange(1, len(names) + 1)))["corr_w"][:, 0, :]
    ranked = np.argsort(-weights, axis=0, kind="stable")  # [n_questions, n_concepts]: question indices
    return tuple(
        tuple(names[index].strip('"') for index in ranked[:, concept] if names[index])[:TOP_SKILLS]
        for concept in range(init_memory.shape[0])
    )


def describe(model: ServedModel) -> dict[str, Any]:
    state: KnowledgeTraceState = model.state
    return {
        "family": state.family.name,
        "supports": dict.fromkeys(("mastery", "attention", "concepts"), state.family.has_concepts),
        "n_questions": state.n_questions,
        "n_concepts": state.n_concepts,
        "seqlen": state.seqlen,
    }


def _refuse(field: tuple[str, ...], values: Sequence[QuestionKey], indexes: list[int], why: str) -> NoReturn:
    """One 422 naming each refused question of a field (the first MAX_LISTED_ERRORS; `next_questions[i]` or
    `interactions[i].question`) and counting all."""
    suffix = () if field[-1] == "next_questions" else ("question",)
    errors = [InvalidInput((*field, i, *suffix), f"question {values[i]!r} {why}") for i in indexes[:MAX_LISTED_ERRORS]]
    raise InvalidInput.joined(errors, count=len(indexes))


def question_numbers(model: ServedModel, values: Sequence[QuestionKey], field: tuple[str, ...]) -> np.ndarray:
    """The graph's question numbers (1..n_questions) of the ids in a request: through the model's own ids where it
    has them, else the ids themselves, integers in range. A wrong id is a 422 naming its item."""
    state: KnowledgeTraceState = model.state
    name, ids, count = model.name, state.question_ids, state.n_questions
    if ids is not None:
        numbers = np.array([ids.numbers.get(value, 0) for value in values], dtype=np.int64)
        if unknown := np.flatnonzero(numbers == 0).tolist():
            kind = "integers" if isinstance(ids.ids[0], int) else "strings"
            where = f"GET /models/{name}/questions lists them"
            _refuse(field, values, unknown, f"is not a question of model {name} (its question ids are {kind}; {where})")
        return numbers
    if str in set(map(type, values)):
        strings = [index for index, value in enumerate(values) if isinstance(value, str)]
        _refuse(field, values, strings, f"is a string; the questions of model {name} are integers 1..{count}")
    numbers = np.fromiter(values, dtype=np.int64, count=len(values))
    if outside := np.flatnonzero((numbers < 1) | (numbers > count)).tolist():
        _refuse(field, values, outside, f"is outside 1..{count}, the questions of model {name}")
    return numbers


_QUESTION, _CORRECT = operator.itemgetter("question"), operator.itemgetter("correct")


def history_arrays(model: ServedModel, interactions: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Questions and answers (0/1) of validated `interactions`, checked against the model's limits."""
    count, limit = len(interactions), model.state.max_interactions
    if count > limit:
        raise InvalidInput(
            ("body", "interactions"), f"{count} interactions; model {model.name} accepts at most {limit}"
        )
    # map(itemgetter) runs in C: a third of the time of a generator expression
    questions = question_numbers(model, list(map(_QUESTION, interactions)), ("body", "interactions"))
    return questions, np.fromiter(map(_CORRECT, interactions), dtype=np.int64, count=count)


def request_arrays(
    model: ServedModel, interactions: Sequence[Mapping[str, Any]], next_questions: Sequence[QuestionKey] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`history_arrays`, and the numbers of the questions to predict next (None: every question), checked too:
    one 422 lists the broken rules of both fields."""
    (questions, correct), wanted = each_checked(
        [
            partial(history_arrays, model, interactions),
            partial(np.arange, 1, model.state.n_questions + 1, dtype=np.int64)
            if next_questions is None
            else partial(question_numbers, model, next_questions, ("body", "next_questions")),
        ]
    )
    return questions, correct, wanted


def rows_needed(model: ServedModel, interactions: int, predicts_next: bool) -> int:
    """Batch rows a request puts through the graph: one per chunk, one for the next-question step."""
    return math.ceil(interactions / model.state.seqlen) + int(predicts_next)


async def trace(
    model: ServedModel, questions: np.ndarray, correct: np.ndarray, memory: np.ndarray | None = None
) -> Trace:
    """Run one history (oldest first) from `memory` (default: the model's initial state), chunk by chunk."""
    (result,) = await trace_all(model, [(questions, correct, memory)])
    return result


async def trace_all(model: ServedModel, histories: Sequence[History]) -> list[Trace]:
    """`trace` of several `(questions, correct, memory)` histories."""
    chunked = [history_chunks(model, *history) for history in histories]
    run = _interleaved if chunks_share_runs(model) else _chained
    return [trace_of(model.state.family, outputs) for outputs in await run(model, chunked)]


def chunks_share_runs(model: ServedModel) -> bool:
    """True when the model's `max_cells` holds two chunks: the k-th chunks of all histories then share runs as
    rows; else each long history runs as a chain, which gives its run slot back every CHAIN_SLICE_S."""
    max_cells = model.batcher.config.max_cells
    return max_cells is None or max_cells >= 2 * model.state.seqlen


async def _chained(model: ServedModel, chunked: list[list[tuple[Feeds, int]]]) -> list[list[Feeds]]:
    """The outputs of each history's chunks: those of one chunk share runs; each longer one is a chain."""
    family = model.state.family
    one_chunk = model.batcher.run_all([(chunks[0][0], 1, chunks[0][1]) for chunks in chunked if len(chunks) < 2])
    chains = [Chain(chunks, family.state_input, family.state_output) for chunks in chunked if len(chunks) > 1]
    if chains:
        short, *long = await asyncio.gather(one_chunk, *map(model.batcher.run_chain, chains))
    else:  # no task per coroutine (gather's): a turn of the event loop less
        short, long = await one_chunk, []
    short, long = iter(short), iter(long)
    return [[next(short)] if len(chunks) < 2 else next(long) for chunks in chunked]


async def _interleaved(model: ServedModel, chunked: list[list[tuple[Feeds, int]]]) -> list[list[Feeds]]:
    """The outputs of each history's chunks: the k-th chunks of all histories are queued together, as rows
    that share runs, each starting from the state its history's chunk k-1 ended with."""
    family = model.state.family
    outputs: list[list[Feeds]] = [[] for _ in chunked]
    for k in range(max(map(len, chunked), default=0)):
        active = [index for index, chunks in enumerate(chunked) if k < len(chunks)]
        requests = []
        for index in active:
            feeds, length = chunked[index][k]
            if k:
                feeds = {**feeds, family.state_input: outputs[index][-1][family.state_output]}
            requests.append((feeds, 1, length))
        for index, result in zip(active, await model.batcher.run_all(requests), strict=True):
            outputs[index].append(result)
    return outputs


def history_chunks(
    model: ServedModel, questions: np.ndarray, correct: np.ndarray, memory: np.ndarray | None
) -> list[tuple[Feeds, int]]:
    """One history's feeds and length, chunk by chunk (one row of at most `seqlen` steps each); the first chunk
    starts from `memory` (default: the initial state), the others from the state before them."""
    state: KnowledgeTraceState = model.state
    initial = (state.init_memory if memory is None else memory)[np.newaxis].astype(np.float32)
    chunks = []
    for start in range(0, len(questions), state.seqlen):
        q, r = (values[start : start + state.seqlen].astype(np.int64)[np.newaxis] for values in (questions, correct))
        feeds = {"q": q, "r": r, "len": np.array([q.shape[1]], dtype=np.int64)}
        if start == 0:
            feeds[state.family.state_input] = initial
        chunks.append((feeds, q.shape[1]))
    return chunks


def trace_of(family: Family, chunks: list[Feeds]) -> Trace:
    """One history's Trace from the outputs of its chunks, in order (a batch row of one each)."""
    predictions = np.concatenate([outputs["p"][0] for outputs in chunks])
    memory = chunks[-1][family.state_output][0]
    if not family.has_concepts:
        return Trace(predictions, None, None, memory)
    attention = np.concatenate([outputs["corr_w"][0] for outputs in chunks])
    mastery = np.concatenate([chunks[0]["mastery"][0], *(outputs["mastery"][0, 1:] for outputs in chunks[1:])])
    return Trace(predictions, attention, mastery, memory)


def step_feeds(family: Family, memory: np.ndarray, questions: np.ndarray) -> Feeds:
    """One row of one step per question, each from `memory` (one read-only view of it for every row)."""
    count = len(questions)
    return {
        "q": questions.astype(np.int64).reshape(count, 1),
        "r": np.zeros((count, 1), dtype=np.int64),
        "len": np.ones(count, dtype=np.int64),
        family.state_input: np.broadcast_to(memory.astype(np.float32), (count, *memory.shape)),
    }


async def predict_next(model: ServedModel, memory: np.ndarray, questions: np.ndarray) -> np.ndarray:
    """P(correct) of each question after the history: one step per question from the final state (a step's
    prediction reads the state before its update, so the answer fed with it does not matter)."""
    feeds = step_feeds(model.state.family, memory, questions)
    return (await model.batcher.run(feeds, len(questions), 1, keep=("p",)))["p"][:, 0]


async def mastery_of(model: ServedModel, memory: np.ndarray) -> np.ndarray | None:
    """The mastery of a value memory: row 0 (the prior) of a one-step run from it; None without memory slots."""
    if not model.state.family.has_concepts:
        return None
    outputs = await model.batcher.run(step_feeds(model.state.family, memory, np.ones(1, dtype=np.int64)), 1, 1)
    return outputs["mastery"][0, 0]


def next_items(model: ServedModel, questions: np.ndarray, probabilities: np.ndarray) -> list[dict[str, Any]]:
    """The `next` list: question, p_correct, its main concept (None without memory slots) and its name."""
    state: KnowledgeTraceState = model.state
    ids = questions.tolist()
    concepts = [None] * len(ids) if state.concepts is None else state.concepts[questions - 1].tolist()
    names = [state.names[question - 1] for question in ids] if state.names else [None] * len(ids)
    shown = ids if state.question_ids is None else [state.question_ids.ids[question - 1] for question in ids]
    return [
        {"question": question, "p_correct": p, "concept": concept, "name": name}
        for question, p, concept, name in zip(shown, probabilities.tolist(), concepts, names, strict=True)
    ]


def answer_numbers(trace: Trace, next_count: int, attention: bool, mastery_rows: slice | None) -> int:
    """What rendering an answer costs, in numbers of its arrays (NEXT_ITEM_NUMBERS per `next` item)."""
    numbers = len(trace.predictions) + next_count * NEXT_ITEM_NUMBERS
    if trace.mastery is not None and mastery_rows is not None:
        numbers += trace.mastery[mastery_rows].size
    if attention and trace.attention is not None:
        numbers += trace.attention.size
    return numbers


def catalog(model: ServedModel, offset: int, limit: int) -> dict[str, Any]:
    """A page of the model's questions (id, name, main concept), and the concepts' labels where the data set has
    them, else null."""
    state: KnowledgeTraceState = model.state
    return {
        "model": model.name,
        "total": state.n_questions,
        "offset": offset,
        "limit": limit,
        "questions": [
            {
                "question": question if state.question_ids is None else state.question_ids.ids[question - 1],
                "name": state.names[question - 1] if state.names else None,
                "concept": None if state.concepts is None else int(state.concepts[question - 1]),
            }
            for question in range(offset + 1, min(offset + limit, state.n_questions) + 1)
        ],
        "concepts": None if state.concept_skills is None else concept_labels(state),
    }


def concept_labels(state: KnowledgeTraceState) -> list[dict[str, Any]]:
    """Each concept with its top skill names, a label joining them, and how many questions it is the main one of."""
    main_of = np.bincount(state.concepts, minlength=state.n_concepts)
    return [
        {"concept": concept, "label": ", ".join(skills), "top_skills": list(skills), "main_of": int(main_of[concept])}
        for concept, skills in enumerate(state.concept_skills)
    ]
