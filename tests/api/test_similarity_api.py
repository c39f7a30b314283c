"""POST /similarity and /similarity/batch over HTTP on the committed LSTM_RMC models: outputs and validation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import COMMITTED, FLMP_MODEL, KT_MODEL, MSRP_MODEL, SIM_MODEL
from tests.helpers import app_client

PAIR = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument, qzxqzx!"}


def test_one_pair_returns_scores_tokens_and_attention(client):
    response = client.post("/similarity", json=PAIR)
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == SIM_MODEL
    assert 1 <= body["relatedness"] <= 5
    assert body["similarity"] == pytest.approx((body["relatedness"] - 1) / 4)
    probabilities = body["entailment"]["probabilities"]
    assert set(probabilities) == {"ENTAILMENT", "NEUTRAL", "CONTRADICTION"}
    assert sum(probabilities.values()) == pytest.approx(1, abs=1e-6)
    assert body["entailment"]["label"] == max(probabilities, key=probabilities.get)
    assert body["tokens_a"] == ["<s>", "a", "man", "is", "playing", "a", "guitar", "</s>"]
    assert body["unknown_tokens"] == ["qzxqzx"]
    for key, tokens in (("sentence_a", body["tokens_a"]), ("sentence_b", body["tokens_b"])):
        matrix = np.array(body["attention"][key])
        assert matrix.shape == (len(tokens), len(tokens))
        assert matrix.min() >= 0 and np.all(matrix.sum(1) <= 1 + 1e-6)


def test_the_msrp_model_answers_paraphrase_next_to_its_encoder_models_scores(client):
    same = {"sentence_a": "The company said its profit rose 10 percent.", "sentence_b": "Its profit rose 10 percent."}
    unrelated = {"sentence_a": "A man is playing a guitar.", "sentence_b": "Shares fell sharply in Tokyo on Monday."}
    for pair, label in ((same, "PARAPHRASE"), (unrelated, "NOT_PARAPHRASE")):
        msrp = client.post("/similarity", json={**pair, "model": MSRP_MODEL}).json()
        sick = client.post("/similarity", json={**pair, "model": SIM_MODEL}).json()
        assert msrp["model"] == MSRP_MODEL and msrp["paraphrase"]["label"] == label
        assert (msrp["paraphrase"]["probability"] >= 0.5) == (label == "PARAPHRASE")
        assert msrp["relatedness"] == pytest.approx(sick["relatedness"], abs=1e-5)
        assert msrp["entailment"]["label"] == sick["entailment"]["label"]
        assert msrp["tokens_a"] == sick["tokens_a"] and msrp["unknown_tokens"] == sick["unknown_tokens"]
        np.testing.assert_allclose(msrp["attention"]["sentence_b"], sick["attention"]["sentence_b"], atol=1e-5)
    batch = client.post("/similarity/batch", json={"pairs": [same, unrelated], "model": MSRP_MODEL}).json()
    assert [result["paraphrase"]["label"] for result in batch["results"]] == ["PARAPHRASE", "NOT_PARAPHRASE"]


def test_only_the_msrp_model_has_paraphrase(client):
    listed = {model["name"]: model for model in client.get("/models").json()["models"]}
    assert listed[MSRP_MODEL]["metadata"]["dataset"] == "msrp"
    assert listed[MSRP_MODEL]["paraphrase_labels"] == ["NOT_PARAPHRASE", "PARAPHRASE"]
    for model in (SIM_MODEL, FLMP_MODEL):
        assert "paraphrase_labels" not in listed[model]
        assert "paraphrase" not in client.post("/similarity", json={**PAIR, "model": model}).json()
        batch = client.post("/similarity/batch", json={"pairs": [PAIR], "model": model}).json()
        assert "paraphrase" not in batch["results"][0]


def test_attention_can_be_left_out(client):
    assert client.post("/similarity", json={**PAIR, "return_attention": False}).json()["attention"] is None


def test_batch_results_are_in_order_and_equal_single_calls(client):
    pairs = [PAIR, {"sentence_a": "A dog runs.", "sentence_b": "A cat is sleeping on a very long and soft sofa."}]
    batch = client.post("/similarity/batch", json={"pairs": pairs, "return_attention": True}).json()
    assert batch["model"] == SIM_MODEL and len(batch["results"]) == 2
    for pair, result in zip(pairs, batch["results"], strict=True):
        single = client.post("/similarity", json=pair).json()
        assert result["relatedness"] == pytest.approx(single["relatedness"], abs=1e-5)
        assert result["tokens_a"] == single["tokens_a"]
        np.testing.assert_allclose(result["attention"]["sentence_a"], single["attention"]["sentence_a"], atol=1e-5)


def test_flmp_model_is_selectable_and_its_map_is_diagonal(client):
    body = client.post("/similarity", json={**PAIR, "model": FLMP_MODEL}).json()
    matrix = np.array(body["attention"]["sentence_a"])
    assert body["model"] == FLMP_MODEL
    assert np.count_nonzero(matrix - np.diag(np.diag(matrix))) == 0


@pytest.mark.parametrize(
    ("body", "location"),
    [
        ({"sentence_a": "", "sentence_b": "b"}, ["body", "sentence_a"]),
        ({"sentence_a": "a", "sentence_b": "   \t"}, ["body", "sentence_b"]),
        ({"sentence_a": "\u2800 \u3164\ufe0f", "sentence_b": "b"}, ["body", "sentence_a"]),  # blank-looking
        ({"sentence_a": "a", "sentence_b": "\u0301 \u20e3"}, ["body", "sentence_b"]),  # marks with no letter
        ({"sentence_a": "a" * 1001, "sentence_b": "b"}, ["body", "sentence_a"]),
        ({"sentence_a": "word " * 63, "sentence_b": "b"}, ["body", "sentence_a"]),  # 65 tokens with markers
        ({"sentence_a": 5, "sentence_b": "b"}, ["body", "sentence_a"]),
        ({"sentence_a": ["a"], "sentence_b": "b"}, ["body", "sentence_a"]),
        ({"sentence_b": "b"}, ["body", "sentence_a"]),
        ({"sentence_a": "a", "sentence_b": "b", "return_attention": "yes"}, ["body", "return_attention"]),
        ({"sentence_a": "a", "sentence_b": "b", "\u202ex\u0000": 1}, ["body", "\\u202ex\\x00"]),  # shown escaped
    ],
)
@pytest.mark.parametrize("model", [SIM_MODEL, FLMP_MODEL])
def test_invalid_pairs_are_422_naming_the_field(client, body, location, model):
    response = client.post("/similarity", json={**body, "model": model})
    assert response.status_code == 422, response.text
    assert any(error["loc"] == location for error in response.json()["detail"])


def test_token_limit_message_names_the_sentence_and_the_limit(client):
    detail = client.post("/similarity", json={"sentence_a": "a", "sentence_b": "x " * 70}).json()["detail"][0]
    assert detail["loc"] == ["body", "sentence_b"] and "at most 64" in detail["msg"]
    assert client.post("/similarity", json={"sentence_a": "word " * 62, "sentence_b": "b"}).status_code == 200


@pytest.mark.parametrize(
    ("pairs", "location"),
    [
        ([], ["body", "pairs"]),
        ([{"sentence_a": "a", "sentence_b": "b"}] * 257, ["body", "pairs"]),
        (
            [{"sentence_a": "a", "sentence_b": "b"}, {"sentence_a": " ", "sentence_b": "b"}],
            ["body", "pairs", 1, "sentence_a"],
        ),
        ([{"sentence_a": "a", "sentence_b": "x " * 70}], ["body", "pairs", 0, "sentence_b"]),
    ],
)
def test_invalid_batches_are_422_naming_the_item(client, pairs, location):
    response = client.post("/similarity/batch", json={"pairs": pairs})
    assert response.status_code == 422, response.text
    assert any(error["loc"] == location for error in response.json()["detail"])


def test_256_pairs_are_served():
    """The batch limit, not admission: on the default 10 s deadline, admission counts the event loop's recent lag
    once per run the pairs need, so a loaded machine may rightly answer 429; with the longest deadline it cannot."""
    with app_client(COMMITTED, request_timeout_s=3600) as patient:
        response = patient.post("/similarity/batch", json={"pairs": [PAIR] * 256})
    assert response.status_code == 200 and len(response.json()["results"]) == 256


def test_unknown_or_wrong_task_model_is_404_listing_the_names(client):
    for name in ("nope", KT_MODEL):
        response = client.post("/similarity", json={**PAIR, "model": name})
        assert response.status_code == 404
        assert SIM_MODEL in response.json()["detail"] and FLMP_MODEL in response.json()["detail"]
    assert client.post("/similarity/batch", json={"pairs": [PAIR], "model": "nope"}).status_code == 404


@pytest.mark.parametrize(
    ("sentence", "words"),
    [
        ("\u0301 \u20e3", "combining marks"),  # marks with no letter: the 422 says why they are no word
        ("\u200f\u202e\u200b", "invisible characters"),  # direction and zero-width marks only
        ("a\x07b", "other than tab, newline and carriage return"),  # the three it allows, all named
    ],
)
def test_a_sentence_that_only_looks_like_text_is_422_saying_why(client, sentence, words):
    detail = client.post("/similarity", json={"sentence_a": "a", "sentence_b": sentence}).json()["detail"]
    assert detail[0]["loc"] == ["body", "sentence_b"] and words in detail[0]["msg"], detail
    assert client.post("/similarity", json={"sentence_a": "a", "sentence_b": "a\r\nb\tc"}).status_code == 200
