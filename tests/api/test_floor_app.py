"""The load benchmark's floor app does the service's whole work: its answers are the service's, byte for byte."""

from __future__ import annotations

import json

import pytest

from app.core.metrics import Metrics
from app.runtime.registry import ModelRegistry
from app.tasks import TASKS
from benchmarks.floor_app import knowledge_trace_answer, similarity_answer
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
