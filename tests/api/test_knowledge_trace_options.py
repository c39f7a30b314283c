"""POST /knowledge-trace response options (mastery none/last/all, predictions on/off) and the catalog's
concept labels, on the committed models (the real app over HTTP with TestClient)."""

from __future__ import annotations

import pytest

from app.tasks.knowledge_trace import rest as knowledge_trace_rest

MODEL = "dkvmn-assist2009"
BODY = {
    "model": MODEL,
    "interactions": [{"question": q, "correct": q % 3 > 0} for q in (12, 12, 40, 7, 99)],
    "next_questions": [3],
}


def trace(client, **options) -> dict:
    response = client.post("/knowledge-trace", json={**BODY, **options})
    assert response.status_code == 200, response.text
    return response.json()


def test_defaults_are_unchanged_every_mastery_row_and_the_predictions(client) -> None:
    full = trace(client)
    assert len(full["mastery"]) == 6 and len(full["mastery"][0]) == 20
    assert len(full["predictions"]) == 5 and len(full["attention"]) == 5


def test_the_history_is_released_before_the_answer_is_rendered(client, monkeypatch) -> None:
    """Its validated dicts are in the arrays by then: long requests in flight do not each hold theirs meanwhile."""
    held, render = [], knowledge_trace_rest.render

    def recording_render(model, body, *arrays):
        held.append(len(body.interactions))
        return render(model, body, *arrays)

    monkeypatch.setattr(knowledge_trace_rest, "render", recording_render)
    history = [{"question": 1 + index % 100, "correct": index % 3 == 0} for index in range(1500)]
    answer = trace(client, interactions=history)
    assert held == [0] and len(answer["predictions"]) == 1500 and len(answer["attention"]) == 1500


def test_mastery_last_none_and_predictions_off_shrink_the_response_only(client) -> None:
    full = trace(client)
    last = trace(client, mastery="last", return_predictions=False, return_attention=False)
    assert last["mastery"] == [full["mastery"][-1]]
    assert last["predictions"] is None and last["attention"] is None
    assert last["next"] == full["next"]
    none = trace(client, mastery="none")
    assert none["mastery"] is None and none["predictions"] == full["predictions"]


@pytest.mark.parametrize(
    ("options", "field"), [({"mastery": "first"}, "mastery"), ({"return_predictions": "no"}, "return_predictions")]
)
def test_bad_options_are_422_naming_the_field(client, options: dict, field: str) -> None:
    response = client.post("/knowledge-trace", json={**BODY, **options})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", field]


def test_assist2009_concepts_are_labelled_by_their_top_skills(client) -> None:
    catalog = client.get(f"/models/{MODEL}/questions", params={"limit": 110}).json()
    concepts = catalog["concepts"]
    assert [concept["concept"] for concept in concepts] == list(range(20))
    names = {question["name"] for question in catalog["questions"]}
    for concept in concepts:
        assert len(concept["top_skills"]) == 3 and set(concept["top_skills"]) <= {name.strip('"') for name in names}
        assert concept["label"] == ", ".join(concept["top_skills"])
    main_concepts = [question["concept"] for question in catalog["questions"]]
    assert [concept["main_of"] for concept in concepts] == [main_concepts.count(index) for index in range(20)]
    by_concept = {concept["concept"]: concept for concept in concepts}
    assert by_concept[13]["top_skills"][0] == "Algebraic Solving"  # measured on the committed model


def test_models_without_skill_names_have_no_concept_labels(client) -> None:
    for model in ("dkvmn-statics", "dkvmn-assist2015", "dkvmn-synthetic"):
        assert client.get(f"/models/{model}/questions").json()["concepts"] is None
