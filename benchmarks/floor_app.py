"""The floor of the HTTP path: POST /similarity and /knowledge-trace (one chunk) as one plain ASGI function.

It reads HTTP as a worker of `python -m app` does (`app.server.http_options`) and uses the service's own schemas,
encoding, one inline ONNX run per graph call, decoding and rendering; without the request edge, admission, batcher
and deadlines. The service's own cost is its p50 less this one's (benchmarks/compare_trees.py).

    python -m benchmarks.floor_app PORT
"""

from __future__ import annotations

import sys

import numpy as np
import uvicorn

from app.core.metrics import Metrics
from app.core.responses import dumps
from app.core.settings import Settings
from app.runtime.memory import tune_malloc
from app.runtime.registry import ModelRegistry
from app.server import http_options
from app.tasks import TASKS
from app.tasks.knowledge_trace import rest as knowledge_rest
from app.tasks.knowledge_trace import service as knowledge
from app.tasks.knowledge_trace.schemas import KnowledgeTraceRequest
from app.tasks.similarity import service as similarity
from app.tasks.similarity.schemas import SimilarityRequest


def similarity_answer(registry: ModelRegistry, body: bytes) -> bytes:
    request = SimilarityRequest.model_validate_json(body)
    model = registry.get(request.model, "similarity")
    (pair,) = similarity.encode_pairs(model, [(request.sentence_a, request.sentence_b)], [("body",)])
    outputs = model.instances[0].run(similarity.pair_feeds(pair))
    return dumps(similarity.decode(model, pair, outputs, request.return_attention))


def knowledge_trace_answer(registry: ModelRegistry, body: bytes) -> bytes:
    request = KnowledgeTraceRequest.model_validate_json(body)
    model = registry.get(request.model, "knowledge-trace")
    questions, correct, wanted = knowledge.request_arrays(model, request.interactions, request.next_questions)
    chunks = knowledge.history_chunks(model, questions, correct, None)
    if len(chunks) > 1:
        raise ValueError("the floor app serves histories of one chunk only")
    trace = knowledge.trace_of(model.state, [model.instances[0].run(chunks[0][0])])
    feeds = knowledge.step_feeds(model.state.state_input, trace[model.state.state_output], wanted)
    next_p = model.instances[0].run(feeds)["p"][:, 0] if len(wanted) else np.zeros(0)
    return knowledge_rest.render(model, request, trace, wanted, next_p)


ANSWERS = {"/similarity": similarity_answer, "/knowledge-trace": knowledge_trace_answer}


def floor_app(registry: ModelRegistry):
    """The ASGI app: the two POST paths above, 404 for anything else."""

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        answer = ANSWERS.get(scope["path"])
        if answer is None or scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        payload = answer(registry, b"".join(chunks))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app


def main() -> None:
    tune_malloc()  # as `python -m app` does, before any thread starts
    settings = Settings()
    registry = ModelRegistry(settings, TASKS, Metrics())
    registry.load()
    options = http_options(settings)
    uvicorn.run(
        floor_app(registry), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", lifespan="off", **options
    )


if __name__ == "__main__":
    main()
