"""`mnemo train similarity` on a user's own scored pairs: parsing and one-line errors, the split, the baseline, and
the whole path (train, export, register, serve, answer) on a small generated CSV, with and without labels."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from app.cli import cli
from models.scored_pairs import NO_LABEL, read_scored_pairs, split_pairs
from models.user_csv import OwnDataError
from tests.helpers import ROOT, running_server

HEADER = "sentence_a,sentence_b,score\n"
SUBJECTS = ("a man", "a woman", "a boy", "a girl", "a dog", "a cat", "the chef", "the player")
VERBS = ("is playing", "is eating", "is watching", "is holding", "is cleaning", "is painting")
OBJECTS = ("a guitar", "an apple", "the television", "a ball", "the kitchen", "a fence")


def write_scored_pairs(path: Path, pairs: int = 80, labels: bool = True, seed: int = 0) -> Path:
    """Pairs from one template, scored by how much of sentence a sentence b keeps (a learnable signal), labelled
    ENTAILMENT (same), CONTRADICTION (negated) or NEUTRAL (words changed), in mixed case."""
    rng = random.Random(seed)
    rows = []
    for index in range(pairs):
        subject, verb, thing = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
        other = {part: rng.choice([option for option in options if option != part]) for part, options in
                 ((subject, SUBJECTS), (verb, VERBS), (thing, OBJECTS))}  # fmt: skip
        second, score, label = [
            ((subject, verb, thing), 5.0, "entailment"),
            ((subject, verb.replace("is ", "is not "), thing), 3.8, "CONTRADICTION"),
            ((subject, verb, other[thing]), 3.2, "Neutral"),
            ((subject, other[verb], other[thing]), 2.1, "neutral"),
            ((other[subject], other[verb], other[thing]), 1.2, "NEUTRAL"),
        ][index % 5]
        row = [f"{subject} {verb} {thing}.".capitalize(), " ".join(second).capitalize(), score, label]
        rows.append(row if labels else row[:3])
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sentence_a", "sentence_b", "score", "label"][: 4 if labels else 3])
        writer.writerows(rows)
    return path


def train_error(*arguments: str) -> str:
    """Run `mnemo train similarity` in process; assert it failed with one line, no traceback; return that line."""
    result = CliRunner().invoke(cli, ["train", "similarity", "--artifacts", "unused", "--name", "m", *arguments])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_train_help_lists_similarity_and_its_help_every_option_without_torch():
    code = (
        "import sys\nfrom app.cli import main\n"
        "for argv in (['train', '--help'], ['train', 'similarity', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "assert 'torch' not in sys.modules, 'app.cli imported torch'\nprint('no torch')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "similarity  Train the LSTM_RMC pair model" in done.stdout and "no torch" in done.stdout
    options = ["--csv", "--artifacts", "--name", "--epochs", "--seed", "--run-dir", "--resume", "--threads"]
    assert all(option in done.stdout for option in [*options, "--no-progress", "--help"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "pairs.csv: no such file"),
        ("", "pairs.csv: the file is empty (expected a header: sentence_a, sentence_b, score)"),
        (HEADER, "pairs.csv: the header has no rows under it"),
        ("sentence_a,sentence_b,relatedness\na,b,3\n", "pairs.csv:1: missing column 'score'"),
        (HEADER + "A dog runs,A dog walks,3\nA cat sits,A cat sleeps,7\n", "pairs.csv:3: column 'score' is '7', not a"),
        (HEADER + "A dog runs,A dog walks,abc\n", "pairs.csv:2: column 'score' is 'abc', not a number in 1..5"),
        (HEADER + "A dog runs,A dog walks,nan\n", "pairs.csv:2: column 'score' is 'nan', not a number in 1..5"),
        (HEADER + "A dog runs,,3\n", "pairs.csv:2: column 'sentence_b' is empty"),
        (HEADER + "?!,A dog walks,3\n", "pairs.csv:2: column 'sentence_a' has no words, only punctuation"),
        (HEADER + "A dog runs,A dog walks,3,extra\n", "pairs.csv:2: more fields than the header has columns"),
        (
            HEADER[:-1] + ",label\nA dog runs,A dog walks,3,maybe\n",
            "pairs.csv:2: column 'label' is 'maybe', not one of",
        ),
        (HEADER[:-1] + ",label\nA dog runs,A dog walks,3,\n", "pairs.csv:2: column 'label' is empty"),
        (HEADER + "A dog runs,A dog walks,3\nA cat sits,A cat sleeps,4\n", "pairs.csv: 2 pair(s): the split by pair"),
        (HEADER + f"A dog runs,{'word ' * 201},3\n", "pairs.csv:2: column 'sentence_b' has 1004 characters; a served"),
        (
            HEADER + "".join(f"Dog {index} runs,A dog walks,3\n" for index in range(10)),
            "the valid split (2 pairs) has a single score, so its Pearson r is undefined: the CSV needs more pairs",
        ),
    ],
)
def test_bad_csvs_get_one_line_naming_the_problem(tmp_path, text, expected):
    path = tmp_path / "pairs.csv"
    if text is not None:
        path.write_text(text)
    assert expected in train_error("--csv", str(path))


def test_labels_are_read_in_any_case_and_a_csv_without_them_is_relatedness_only(tmp_path):
    labelled = read_scored_pairs(write_scored_pairs(tmp_path / "a.csv", pairs=5))
    assert labelled.labelled and [pair.entailment for pair in labelled.pairs] == [0, 2, 1, 1, 1]
    assert [pair.relatedness for pair in labelled.pairs] == [5.0, 3.8, 3.2, 2.1, 1.2]
    plain = read_scored_pairs(write_scored_pairs(tmp_path / "b.csv", pairs=5, labels=False))
    assert not plain.labelled and {pair.entailment for pair in plain.pairs} == {NO_LABEL}


def test_the_split_is_by_pair_seeded_and_covers_every_pair(tmp_path):
    data = read_scored_pairs(write_scored_pairs(tmp_path / "pairs.csv", pairs=40))
    splits = split_pairs(data, seed=3)
    assert splits == split_pairs(data, seed=3) != split_pairs(data, seed=4)
    rows = splits["train"] + splits["valid"] + splits["test"]
    assert sorted(rows) == list(range(40)) and len(splits["test"]) == len(splits["valid"]) == 6


def test_the_baseline_fits_its_line_on_train_and_scores_test(tmp_path):
    from app.tasks.similarity.vectors import WordVectors, special_vectors
    from models.train_own_similarity import baseline

    pairs = read_scored_pairs(write_scored_pairs(tmp_path / "pairs.csv", pairs=60)).pairs
    found = baseline(WordVectors.from_glove(special_vectors()), pairs[:45], pairs[45:], labelled=True)
    assert found["pearson"] > 0.5  # the generated score follows word overlap, which mean-vector cosine sees
    assert found["mse"] < found["train_mean_mse"]
    assert found["accuracy"] == pytest.approx(9 / 15)  # NEUTRAL, the training split's most frequent label


def train_arguments(data: Path, artifacts: Path, name: str, run_dir: Path) -> list[str]:
    arguments = ["train", "similarity", "--csv", str(data), "--artifacts", str(artifacts), "--name", name]
    return [*arguments, "--epochs", "1", "--run-dir", str(run_dir), "--no-progress"]


@pytest.mark.slow
def test_train_export_serve_and_answer_with_and_without_labels(tmp_path):
    """The whole path on generated CSVs into a new artifacts directory: train 1 epoch, export (parity-checked),
    register, serve, answer; the model trained without labels answers relatedness only. The first runs as the
    real command, the second in process (the same code, without a second interpreter and torch import)."""
    pytest.importorskip("torch", reason="training needs the train extra")
    artifacts = tmp_path / "artifacts"
    labelled = train_arguments(write_scored_pairs(tmp_path / "mine.csv"), artifacts, "mine", tmp_path / "mine")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", *labelled], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    plain = write_scored_pairs(tmp_path / "mine-r.csv", labels=False)
    in_process = CliRunner().invoke(cli, train_arguments(plain, artifacts, "mine-r", tmp_path / "mine-r"))
    assert in_process.exit_code == 0, in_process.output
    for output in (done.stdout, in_process.output):
        assert "test Pearson r" in output and "GloVe-cosine baseline r" in output
    runs = {name: json.loads((tmp_path / name / "result.json").read_text()) for name in ("mine", "mine-r")}

    entries = {entry["name"]: entry for entry in json.loads((artifacts / "manifest.json").read_text())["models"]}
    assert entries["mine"]["default"] and not entries["mine-r"]["default"]
    assert entries["mine"]["metrics"]["test_pearson"] == round(runs["mine"]["test"]["pearson"], 4)
    assert "test_entailment_accuracy" in entries["mine"]["metrics"]
    assert "test_entailment_accuracy" not in entries["mine-r"]["metrics"]
    assert entries["mine-r"]["metadata"]["entailment_labels"] == []
    assert entries["mine"]["assets"]["vocabulary"]["file"] == "glove-6b-50d.vocab.npy"
    card = (artifacts / "mine.md").read_text()
    test, base = runs["mine"]["test"], runs["mine"]["baseline_test"]
    assert f"| relatedness Pearson r | {test['pearson']:.4f} | {base['pearson']:.4f} |" in card
    assert runs["mine"]["protocol"]["data"]["sha256"] in card and runs["mine"]["command"] in card
    assert "entailment accuracy" not in (artifacts / "mine-r.md").read_text()

    pair = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A man is not playing a guitar"}
    with running_server(artifacts) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        served = {model["name"]: model for model in client.get("/models").json()["models"]}
        assert served["mine"]["entailment_labels"] == ["ENTAILMENT", "NEUTRAL", "CONTRADICTION"]
        assert served["mine-r"]["entailment_labels"] == []
        answer = client.post("/similarity", json={**pair, "model": "mine"})
        assert answer.status_code == 200, answer.text
        assert (
            1 <= answer.json()["relatedness"] <= 5
            and answer.json()["entailment"]["label"] in served["mine"]["entailment_labels"]
        )
        assert answer.json()["tokens_b"] == ["<s>", "a", "man", "is", "not", "playing", "a", "guitar", "</s>"]
        plain = client.post("/similarity", json={**pair, "model": "mine-r"})
        assert plain.status_code == 200, plain.text
        assert 1 <= plain.json()["relatedness"] <= 5 and "entailment" not in plain.json()
        batch = client.post("/similarity/batch", json={"pairs": [pair, pair], "model": "mine-r"}).json()
        assert [result["relatedness"] for result in batch["results"]] == [plain.json()["relatedness"]] * 2
        assert client.post("/similarity", json=pair).json()["model"] == "mine"  # the directory's default
        inputs = [{"name": key, "datatype": "BYTES", "shape": [1], "data": [pair[key]]} for key in pair]
        for name, outputs in (("mine", ["relatedness", "entailment_probabilities"]), ("mine-r", ["relatedness"])):
            protocol = client.post(f"/v2/models/{name}/infer", json={"inputs": inputs})
            assert protocol.status_code == 200, protocol.text
            assert [output["name"] for output in protocol.json()["outputs"]] == [*outputs, "tokens_a", "tokens_b"]


@pytest.mark.slow
def test_an_interrupted_run_resumes_only_with_resume_and_its_own_protocol(tmp_path):
    pytest.importorskip("torch", reason="training needs the train extra")
    from dataclasses import replace

    from models.train_own_similarity import Run, train

    data = read_scored_pairs(write_scored_pairs(tmp_path / "pairs.csv", pairs=30))
    run = Run(tmp_path / "pairs.csv", tmp_path / "run", epochs=2, seed=0, progress=False)
    first = train(run, data, "test")
    assert first["epochs_run"] == 2
    (run.run_dir / "result.json").unlink()  # as if stopped after its last checkpoint, before the test evaluation
    with pytest.raises(OwnDataError, match="holds an unfinished run: pass --resume"):
        train(run, data, "test")
    with pytest.raises(OwnDataError, match=r"--resume: .* was written for other data or settings"):
        train(replace(run, resume=True, seed=1), data, "test")
    resumed = train(replace(run, resume=True), data, "test")
    assert resumed["epochs_run"] == 2 and resumed["history"] == first["history"]
    assert resumed["test"] == first["test"]
