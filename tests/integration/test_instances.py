"""Two CPU instances of every committed model in a real server (`MNEMO_PROVIDER=cpu,cpu`): the answers do not
depend on the instance or the batch a request ran in, and both instances are listed and counted."""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import pytest

from tests.conftest import COMMITTED
from tests.helpers import running_server, same_answer

pytestmark = pytest.mark.slow  # a server process

SENTENCES = [
    ("A man is playing a guitar.", "A person plays an instrument."),
    ("Dogs run in the park.", "A cat sleeps on the very long and soft sofa in the living room."),
    ("Nobody is cutting an onion.", "A woman is slicing an onion."),
    ("A kid is on a slide.", "A child slides down."),
]
KT_MODELS = ("dkvmn-assist2009", "dkt-assist2009")


def _bodies() -> list[tuple[str, dict]]:
    rng = np.random.default_rng(0)
    bodies = [("/similarity", {"sentence_a": a, "sentence_b": b}) for a, b in SENTENCES]
    for model in KT_MODELS:
        for steps in (5, 80, 200, 450):
            interactions = [
                {"question": int(q), "correct": bool(c)}
                for q, c in zip(rng.integers(1, 111, steps), rng.random(steps) < 0.6, strict=True)
            ]
            bodies.append(
                ("/knowledge-trace", {"model": model, "interactions": interactions, "next_questions": [3, 7]})
            )
    return bodies


async def _answers(url: str, bodies: list[tuple[str, dict]], together: bool) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        if together:  # all in flight at once, several times over: they share runs and spread over the instances
            responses = await asyncio.gather(*(client.post(path, json=body) for _ in range(4) for path, body in bodies))
        else:
            responses = [await client.post(path, json=body) for path, body in bodies]
    assert {response.status_code for response in responses} == {200}
    return [response.json() for response in responses]


def test_answers_do_not_depend_on_the_instance_or_the_batch():
    bodies = _bodies()
    with running_server(COMMITTED, MNEMO_PROVIDER="cpu,cpu", MNEMO_CONCURRENT_RUNS="2") as server:
        alone = asyncio.run(_answers(server.url, bodies, together=False))
        together = asyncio.run(_answers(server.url, bodies, together=True))
        models = httpx.get(f"{server.url}/models").json()["models"]
        metrics = httpx.get(f"{server.url}/metrics").text
    for index, answer in enumerate(together):
        assert same_answer(alone[index % len(bodies)], answer, tolerance=1e-6)
    assert all([i["name"] for i in model["instances"]] == ["cpu-0", "cpu-1"] for model in models)
    runs = re.findall(r'mnemo_instance_runs_total{model="[^"]+",model_instance="([^"]+)"} (\S+)', metrics)
    assert {name for name, _ in runs} == {"cpu-0", "cpu-1"}  # every instance's series, listed from the start
    assert sum(float(count) for _, count in runs) > 0
