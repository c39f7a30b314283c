"""The load benchmark's floor app does the service's whole work: its answers are the service's, byte for byte."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.core.metrics import Metrics
from app.runtime.registry import ModelRegistry
from app.tasks import TASKS
from benchmarks import own_cost_layers
from benchmarks.floor_app import ANSWERS, knowledge_trace_answer, similarity_answer
from benchmarks.load import scenarios
from tests.conftest import COMMITTED, KT_MODEL, SIM_MODEL
from tests.helpers import app_settings


@pytest.fixture(scope="module")
def registry() -> ModelRegistry:
    loaded = ModelRegistry(app_settings(COMMITTED), TASKS, Metrics())
    loaded.load()
    return loaded


@pytest.mark.parametrize("attention", [False, True])
def test_similarity_answers_are_the_services(client, registry, attention):
    body = {"sentence_a": "A man plays a guitar.", "sentence_b": "Someone plays music.", "return_attention": attention}
    served = client.post("/similarity", json={**body, "model": SIM_MODEL})
    assert served.status_code == 200
    assert similarity_answer(registry, json.dumps({**body, "model": SIM_MODEL}).encode()) == served.content


@pytest.mark.parametrize("options", [{}, {"return_attention": False, "mastery": "last", "next_questions": [3, 7]}])
def test_knowledge_trace_answers_are_the_services(client, registry, options):
    interactions = [{"question": i % 50 + 1, "correct": i % 3 != 0} for i in range(40)]
    body = json.dumps({"model": KT_MODEL, "interactions": interactions, **options}).encode()
    served = client.post("/knowledge-trace", content=body, headers={"content-type": "application/json"})
    assert served.status_code == 200
    assert knowledge_trace_answer(registry, body) == served.content


def test_the_layer_benchmark_answers_every_scenario_through_each_layer(capsys):
    """benchmarks/own_cost_layers.py: each layer's call is answered (200 through the app, else it raises), and each
    scenario of concurrency 1 gets its table of five layers."""
    asyncio.run(own_cost_layers.measure(requests=2, only=""))
    printed = capsys.readouterr().out
    tables = [part for part in printed.split("\n\n") if part.strip()]
    assert len(tables) == sum(1 for s in scenarios() if 1 in s.concurrency and s.path in ANSWERS) >= 3
    for table in tables:
        rows = [line.split(" | ")[0].strip("| ") for line in table.splitlines() if line.startswith("| ")]
        assert rows == ["layer", "floor", "answer", "admitted", "deadline", "app"], table
