"""The MSRP paraphrase pipeline on generated MSRP files: train (train file only), choose on validation, export
(the pair graph plus the head, checked against the pair graph and PyTorch), card, manifest, and serving."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.tasks.similarity.tokenizer import tokenize
from app.tasks.similarity.vectors import WordVectors
from tests.conftest import SIM_MODEL
from tests.helpers import app_client
from tests.synthetic_data import write_msrp

pytest.importorskip("torch", reason="the exporter needs the train extra")

import torch

from export import embeddings as export_embeddings
from export import paraphrase as export_paraphrase
from models import train_paraphrase
from models.msrp_data import SPLIT_FILES, read_split
from models.paraphrase import ParaphraseHead, cpu_session, sentence_vectors
from models.training import load_checkpoint

MODEL = "rmc-msrp-tiny"
PAIR = {"sentence_a": "a man is playing a guitar", "sentence_b": "a man is playing a ball"}


@pytest.fixture(scope="module")
def pipeline(tiny_artifacts: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny VLMP model with its embedding graphs; two paraphrase runs on a data directory that holds no
    test file (training must not read it); the export of the better one."""
    root = tmp_path_factory.mktemp("paraphrase")
    artifacts = Path(shutil.copytree(tiny_artifacts, root / "artifacts"))
    sick = tiny_artifacts.parent / "sick"
    export_embeddings.main(["--name", SIM_MODEL, "--artifacts", str(artifacts), "--data-dir", str(sick)])
    data = write_msrp(root / "msrp")
    train_only = root / "msrp-train-only"
    train_only.mkdir()
    shutil.copy(data / SPLIT_FILES["train"], train_only)
    runs = [root / "runs" / "a", root / "runs" / "b"]
    for run, dropout in zip(runs, ("0.25", "0.5"), strict=True):
        common = ["--encoder-model", SIM_MODEL, "--artifacts", str(artifacts), "--data-dir", str(train_only)]
        train_paraphrase.main([*common, "--out", str(run), "--epochs", "3", "--hidden", "8", "--dropout", dropout])
    arguments = [argument for run in runs for argument in ("--run", str(run))]
    export_paraphrase.main([*arguments, "--name", MODEL, "--artifacts", str(artifacts), "--data-dir", str(data)])
    entries = {entry["name"]: entry for entry in json.loads((artifacts / "manifest.json").read_text())["models"]}
    return {"artifacts": artifacts, "runs": runs, "data": data, "entries": entries}


def graph_outputs(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = cpu_session(path, threads=1)
    return dict(zip([output.name for output in session.get_outputs()], session.run(None, feeds), strict=True))


def test_the_served_graph_is_the_pair_graph_plus_the_head(pipeline):
    artifacts, entries = pipeline["artifacts"], pipeline["entries"]
    sim = entries[SIM_MODEL]
    vectors = WordVectors.from_glove(np.load(artifacts / sim["assets"]["special_vectors"]["file"]))
    pairs = read_split(pipeline["data"] / SPLIT_FILES["test"])[:12]
    a = [vectors.embed(tokenize(pair.sentence_a))[0] for pair in pairs]
    b = [vectors.embed(tokenize(pair.sentence_b))[0] for pair in pairs]
    feeds_a, feeds_b = export_embeddings.padded(a), export_embeddings.padded(b)
    length = max(feeds_a["emb"].shape[1], feeds_b["emb"].shape[1])
    feeds = {}
    for side, part in (("a", feeds_a), ("b", feeds_b)):
        feeds[f"emb_{side}"] = np.pad(part["emb"], ((0, 0), (0, length - part["emb"].shape[1]), (0, 0)))
        feeds[f"len_{side}"] = part["len"]
    served = graph_outputs(artifacts / entries[MODEL]["file"], feeds)
    original = graph_outputs(artifacts / sim["file"], feeds)
    assert set(served) == {*original, "paraphrase_logits"}
    for name, value in original.items():
        np.testing.assert_allclose(served[name], value, atol=1e-5, err_msg=name)
    encoder = cpu_session(artifacts / sim["graphs"]["encoder"]["file"], threads=1)
    chosen = next(run for run in pipeline["runs"] if run.name in (artifacts / f"{MODEL}.md").read_text())
    checkpoint = load_checkpoint(chosen / "best.pt")
    head = ParaphraseHead(**checkpoint["config"])
    head.load_state_dict(checkpoint["model"])
    u, v = (sentence_vectors(encoder, vectors, [getattr(p, f"sentence_{s}") for p in pairs]) for s in "ab")
    with torch.no_grad():
        expected = head.eval()(torch.from_numpy(u), torch.from_numpy(v)).numpy()
        swapped = head(torch.from_numpy(v), torch.from_numpy(u)).numpy()
    np.testing.assert_allclose(served["paraphrase_logits"], expected, atol=1e-4)
    np.testing.assert_allclose(swapped, expected, atol=1e-6)  # the head does not care which sentence is first


def test_the_run_with_the_best_validation_accuracy_is_exported(pipeline):
    results = [json.loads((run / "result.json").read_text()) for run in pipeline["runs"]]
    accuracies = [result["valid"]["accuracy"] for result in results]
    best = pipeline["runs"][accuracies.index(max(accuracies))]
    card = (pipeline["artifacts"] / f"{MODEL}.md").read_text()
    assert f"| `{best.name}` |" in card and "| selected |" in card.split(f"| `{best.name}` |")[1].split("\n")[0]
    assert all(result["data_files"].keys() == {"train"} for result in results)


def test_manifest_entry_and_card(pipeline):
    artifacts, entry = pipeline["artifacts"], pipeline["entries"][MODEL]
    assert entry["task"] == "similarity" and entry["version"] == "1.0.0" and not entry["default"]
    assert entry["metadata"]["dataset"] == "msrp" and entry["metadata"]["encoder_model"] == SIM_MODEL
    assert "graphs" not in entry
    test_pairs = read_split(pipeline["data"] / SPLIT_FILES["test"])
    assert 0 <= entry["metrics"]["test_paraphrase_accuracy"] <= 1
    assert round(entry["metrics"]["test_paraphrase_accuracy"] * len(test_pairs)) in range(len(test_pairs) + 1)
    card = (artifacts / entry["card"]).read_text()
    for heading in ("## Test metrics", "## What saw the test split", "## Reproduce", "## Training", "## Export"):
        assert heading in card
    assert f"| {MODEL} | {entry['metrics']['test_paraphrase_accuracy']:.4f} |" in card
    assert f"{len(test_pairs)} pairs; evaluated once" in card


def test_served_by_name_with_a_paraphrase_field_and_the_other_models_unchanged(pipeline):
    artifacts = pipeline["artifacts"]
    with app_client(artifacts) as client:
        models = {model["name"]: model for model in client.get("/models").json()["models"]}
        answer = client.post("/similarity", json={**PAIR, "model": MODEL, "return_attention": False}).json()
        plain = client.post("/similarity", json={**PAIR, "model": SIM_MODEL, "return_attention": False}).json()
        batch = client.post("/similarity/batch", json={"pairs": [PAIR, PAIR], "model": MODEL}).json()
        oip = client.post(
            f"/v2/models/{MODEL}/infer",
            json={
                "inputs": [
                    {"name": "sentence_a", "datatype": "BYTES", "shape": [1], "data": [PAIR["sentence_a"]]},
                    {"name": "sentence_b", "datatype": "BYTES", "shape": [1], "data": [PAIR["sentence_b"]]},
                ]
            },
        ).json()
    assert models[MODEL]["metadata"]["dataset"] == "msrp"
    assert models[MODEL]["paraphrase_labels"] == ["NOT_PARAPHRASE", "PARAPHRASE"]
    assert "paraphrase_labels" not in models[SIM_MODEL]
    paraphrase = answer["paraphrase"]
    assert paraphrase["label"] == ("PARAPHRASE" if paraphrase["probability"] >= 0.5 else "NOT_PARAPHRASE")
    assert "paraphrase" not in plain
    assert {key: answer[key] for key in plain if key != "model"} == {key: plain[key] for key in plain if key != "model"}
    assert [result["paraphrase"] for result in batch["results"]] == [paraphrase, paraphrase]
    probability = next(output for output in oip["outputs"] if output["name"] == "paraphrase_probability")
    assert math.isclose(probability["data"][0], paraphrase["probability"], rel_tol=1e-6)
