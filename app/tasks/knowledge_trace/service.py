"""The knowledge-tracing service, transport-free: check a request, run each history through the batcher in chunks of
`seqlen` (each from the state the one before ended with), decode."""

from __future__ import annotations

import asyncio
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

import numpy as np

from app.core.errors import MAX_LISTED_ERRORS, InvalidInput
from app.core.manifest import positive_int
from app.runtime.batcher import Chain
from app.runtime.collate import Feeds
from app.runtime.model import ServedModel
from app.tasks.knowledge_trace.schemas import QuestionKey

TASK_NAME = "knowledge-trace"
SKILL_NAMED_DATASETS = frozenset({"assist2009"})  # question names are skill names: concepts get readable labels
TOP_SKILLS = 3
FAMILIES = {"dkvmn": ("mv_in", "mv_out"), "dkt": ("state_in", "state_out")}  # each graph family's state in, out
History = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # questions, correct, memory (None: the initial state)


@dataclass(frozen=True)
class KnowledgeTraceState:
    """What requests need from one knowledge-tracing model, checked at startup (DKT: no concept fields, None)."""

    family: str
    state_input: str  # the recurrent state's names in the graph
    state_output: str
    n_questions: int
    seqlen: int
    max_interactions: int
    max_histories: int  # rows of one Open Inference Protocol request (each with its state in and out)
    init_memory: np.ndarray  # the state a history starts from: DKVMN [N, d_v], DKT [2, S] float32
    names: tuple[str | None, ...] | None  # question names where the data set has them
    question_ids: tuple[QuestionKey, ...] | None  # the model's own ids (`mnemo train kt`), of questions 1..n; or None
    numbers: dict[QuestionKey, int] | None  # each own id's question number
    n_concepts: int | None = None
    concepts: np.ndarray | None = None  # [n_questions]: each question's main concept
    concept_skills: tuple[tuple[str, ...], ...] | None = None  # per concept: top skill names (skill-named data sets)


def prepare(model: ServedModel) -> KnowledgeTraceState:
    """Sizes from the manifest, checked against the assets and the graph."""
    metadata, assets = model.entry.metadata, model.assets
    family = metadata.get("family", "dkvmn")
    if family not in FAMILIES:
        raise ValueError(f"metadata.family is {family!r}; known: {', '.join(FAMILIES)}")
    state_input, state_output = FAMILIES[family]
    inputs = {node.name: node for node in model.session.get_inputs()}
    outputs = {node.name for node in model.session.get_outputs()}
    if state_input not in inputs or state_output not in outputs:
        raise ValueError(
            f"a {family} graph takes {state_input} and gives {state_output}; this one takes "
            f"{', '.join(sorted(inputs))} and gives {', '.join(sorted(outputs))}"
        )
    n_questions, seqlen = (positive_int(metadata, key) for key in ("n_questions", "seqlen"))
    for key in ("question_names", "question_ids", "question_concepts"):  # of question k at row k - 1
        if key in assets and np.shape(assets[key]) != (n_questions,):
            raise ValueError(f"{key} has shape {np.shape(assets[key])}, not ({n_questions},)")
    names = None if "question_names" not in assets else tuple(str(name) or None for name in assets["question_names"])
    ids = numbers = None
    if "question_ids" in assets:  # the model's own ids: unique, all integers or all strings
        asset = np.asarray(assets["question_ids"])
        if asset.dtype.kind not in "iU":
            raise ValueError(f"question_ids must hold integers or strings, not {asset.dtype}")
        if len(np.unique(asset)) != n_questions:
            raise ValueError("question_ids repeats an id")
        ids = tuple(asset.tolist())
        numbers = {question: number for number, question in enumerate(ids, start=1)}
    limits = [positive_int(model.entry.limits, key) for key in ("max_interactions", "max_histories")]
    slots = concepts = skills = None
    if family == "dkvmn":
        slots = positive_int(metadata, "n_concepts")
        concepts = np.asarray(assets["question_concepts"]).astype(np.int64)
        initial = np.asarray(assets["init_memory"], dtype=np.float32)
        if initial.ndim != 2 or initial.shape[0] != slots:
            raise ValueError(f"init_memory has shape {initial.shape}, not ({slots}, d_v)")
        if names is not None and metadata.get("dataset") in SKILL_NAMED_DATASETS:  # per concept, the TOP_SKILLS
            # questions (unquoted names) weighing most on it: one step each, from any memory (weights read keys only)
            feeds = step_feeds(state_input, initial, np.arange(1, n_questions + 1))
            weights = model.instances[0].run(feeds)["corr_w"][:, 0, :]
            ranked = np.argsort(-weights, axis=0, kind="stable")  # [n_questions, slots]: question indices
            skills = tuple(
                tuple(names[index].strip('"') for index in ranked[:, concept] if names[index])[:TOP_SKILLS]
                for concept in range(slots)
            )
    else:  # a DKT history starts from zeros, shaped as the graph's state input
        shape = inputs[state_input].shape[1:]
        if len(shape) != 2 or not all(isinstance(size, int) and size > 0 for size in shape):
            raise ValueError(f"{state_input} must have a fixed [2, S] shape after the batch, not {shape}")
        initial = np.zeros(shape, dtype=np.float32)
    return KnowledgeTraceState(
        family, *FAMILIES[family], n_questions, seqlen, *limits, initial, names, ids, numbers, slots, concepts, skills
    )


def describe(model: ServedModel) -> dict[str, Any]:
    state: KnowledgeTraceState = model.state
    supports = dict.fromkeys(("mastery", "attention", "concepts"), state.n_concepts is not None)
    sizes = {key: getattr(state, key) for key in ("n_questions", "n_concepts", "seqlen")}
    return {"family": state.family, "supports": supports, **sizes}


def request_arrays(
    model: ServedModel, interactions: Sequence[Mapping[str, Any]], next_questions: Sequence[QuestionKey] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The graph's numbers (1..n_questions) of the questions of validated `interactions`, their answers (0/1), and
    the numbers of `next_questions` (None: all): one 422 for both fields lists the wrong ids and counts all."""
    state, name, count = model.state, model.name, len(interactions)
    n, limit = state.n_questions, state.max_interactions
    too_many = f"{count} interactions; model {name} accepts at most {limit}"
    errors = [InvalidInput(("body", "interactions"), too_many)] if count > limit else []
    history = [] if errors else list(map(operator.itemgetter("question"), interactions))  # map(itemgetter) runs in C
    ids = history + list(next_questions or ())
    if state.numbers is not None:
        numbers = np.array([state.numbers.get(value, 0) for value in ids], dtype=np.int64)
        kind = "integers" if isinstance(state.question_ids[0], int) else "strings"
        why = dict.fromkeys(
            (int, str),
            f"is not a question of model {name} (its question ids are {kind}; GET /models/{name}/questions lists them)",
        )
    else:
        numbers = np.array(
            [0 if type(v) is str else v for v in ids] if str in set(map(type, ids)) else ids, dtype=np.int64
        )
        why = {
            int: f"is outside 1..{n}, the questions of model {name}",
            str: f"is a string; the questions of model {name} are integers 1..{n}",
        }
    refused = np.flatnonzero((numbers < 1) | (numbers > n)).tolist()
    for index in refused[:MAX_LISTED_ERRORS]:
        at = ("interactions", index, "question") if index < len(history) else ("next_questions", index - len(history))
        errors.append(InvalidInput(("body", *at), f"question {ids[index]!r} {why[type(ids[index])]}"))
    if errors:
        raise InvalidInput.joined(errors, count=len(refused) + (count > limit))
    wanted = np.arange(1, n + 1, dtype=np.int64) if next_questions is None else numbers[len(history) :]
    correct = np.fromiter(map(operator.itemgetter("correct"), interactions), dtype=np.int64, count=count)
    return numbers[: len(history)], correct, wanted


def rows_needed(model: ServedModel, interactions: int, predicts_next: bool) -> int:
    """Batch rows a request puts through the graph: one per chunk, one for the next-question step."""
    return math.ceil(interactions / model.state.seqlen) + int(predicts_next)


async def trace_all(model: ServedModel, histories: Sequence[History]) -> list[Feeds]:
    """Run each `(questions, correct, memory)` history (oldest first; memory None: the initial state) in chunks: the
    k-th chunks of all histories share runs, but where `max_cells` holds less than two, a longer one runs as a chain."""
    state, max_cells = model.state, model.batcher.config.max_cells
    chain_long = max_cells is not None and max_cells < 2 * state.seqlen  # two chunks would not share a run
    chains = [Chain(history_chunks(model, *history), state.state_input, state.state_output) for history in histories]
    alone = [chain_long and len(chain.chunks) > 1 for chain in chains]
    shared = _interleaved(model, [chain for chain, own in zip(chains, alone, strict=True) if not own])
    if any(alone):  # else no task per coroutine (gather's): a turn of the event loop less
        await asyncio.gather(shared, *map(model.batcher.run_chain, compress(chains, alone)))
    else:
        await shared
    return [trace_of(state, chain.outputs) for chain in chains]


async def _interleaved(model: ServedModel, chains: list[Chain]) -> None:
    """Run the chains' chunks in step: the k-th chunks of all of them are queued together, sharing runs."""
    while active := [chain for chain in chains if chain.remaining]:
        requests = [(feeds, 1, length) for feeds, length in map(Chain.next_chunk, active)]
        for chain, outputs in zip(active, await model.batcher.run_all(requests), strict=True):
            chain.outputs.append(outputs)


def history_chunks(
    model: ServedModel, questions: np.ndarray, correct: np.ndarray, memory: np.ndarray | None
) -> list[tuple[Feeds, int]]:
    """One history's feeds and length per chunk of `seqlen` steps, the first from `memory` (None: the initial one)."""
    state: KnowledgeTraceState = model.state
    chunks = []
    for start in range(0, len(questions), state.seqlen):
        q, r = (values[start : start + state.seqlen].astype(np.int64)[np.newaxis] for values in (questions, correct))
        chunks.append(({"q": q, "r": r, "len": np.array([q.shape[1]], dtype=np.int64)}, q.shape[1]))
    initial = state.init_memory if memory is None else memory
    chunks[0][0][state.state_input] = initial[np.newaxis].astype(np.float32, copy=False)
    return chunks


def trace_of(state: KnowledgeTraceState, chunks: list[Feeds]) -> Feeds:
    """One history's outputs, named as in the graph, from its chunks' (a batch row of one each, in order): `p` [T],
    DKVMN's `corr_w` [T,N] and `mastery` [T+1,N] (row 0 the prior), and the final state."""
    trace = {state.state_output: chunks[-1][state.state_output][0]}
    for name in ("p", "corr_w", "mastery") if state.n_concepts else ("p",):
        later = [outputs[name][0, int(name == "mastery") :] for outputs in chunks[1:]]  # the prior row only once
        trace[name] = np.concatenate([chunks[0][name][0], *later])
    return trace


def step_feeds(state_input: str, memory: np.ndarray, questions: np.ndarray) -> Feeds:
    """One row of one step per question, each from `memory` (one read-only view of it for every row)."""
    count = len(questions)
    return {
        "q": questions.astype(np.int64).reshape(count, 1),
        "r": np.zeros((count, 1), dtype=np.int64),
        "len": np.ones(count, dtype=np.int64),
        state_input: np.broadcast_to(memory.astype(np.float32, copy=False), (count, *memory.shape)),
    }


async def predict_next(model: ServedModel, memory: np.ndarray, questions: np.ndarray) -> np.ndarray:
    """P(correct) of each question: one step from `memory` (a step predicts before its update: any answer will do)."""
    feeds = step_feeds(model.state.state_input, memory, questions)
    return (await model.batcher.run(feeds, len(questions), 1, keep=("p",)))["p"][:, 0]


async def mastery_of(model: ServedModel, memory: np.ndarray) -> np.ndarray | None:
    """The mastery of a value memory: row 0 (the prior) of a one-step run from it; None without memory slots."""
    if model.state.n_concepts is None:
        return None
    outputs = await model.batcher.run(step_feeds(model.state.state_input, memory, np.ones(1, dtype=np.int64)), 1, 1)
    return outputs["mastery"][0, 0]


def question_items(model: ServedModel, numbers: np.ndarray, p_correct: np.ndarray | None = None) -> list[dict]:
    """Each question's id as requests name it, its name, its main concept (None without memory slots) and, given
    `p_correct`, its probability: the catalog's questions and the answers' `next` lists."""
    state: KnowledgeTraceState = model.state
    ids = numbers.tolist()
    columns = {"question": ids if state.question_ids is None else [state.question_ids[number - 1] for number in ids]}
    columns |= {} if p_correct is None else {"p_correct": p_correct.tolist()}
    columns["concept"] = [None] * len(ids) if state.concepts is None else state.concepts[numbers - 1].tolist()
    columns["name"] = [state.names[number - 1] for number in ids] if state.names else [None] * len(ids)
    return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def catalog(model: ServedModel, offset: int, limit: int) -> dict[str, Any]:
    """A page of the model's questions (id, name, main concept), and each concept's label where skills are named."""
    state: KnowledgeTraceState = model.state
    page = np.arange(offset + 1, min(offset + limit, state.n_questions) + 1)
    answer = {"model": model.name, "total": state.n_questions, "offset": offset, "limit": limit}
    answer |= {"questions": question_items(model, page), "concepts": None}
    if state.concept_skills is not None:
        main_of = np.bincount(state.concepts, minlength=state.n_concepts)
        answer["concepts"] = [
            dict(concept=concept, label=", ".join(skills), top_skills=list(skills), main_of=int(main_of[concept]))
            for concept, skills in enumerate(state.concept_skills)
        ]
    return answer
