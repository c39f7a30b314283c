"""`mnemo train kt` on a user's own CSV: parsing and one-line errors, the split, and the whole path (train, export,
register, serve, answer with the CSV's own question ids) on a small generated CSV."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from app.cli import cli
from models.answer_log import AnswerLogError, read_answer_log, split_students
from tests.conftest import COMMITTED, KT_MODEL
from tests.helpers import ROOT, running_server
from tests.synthetic_data import write_answer_log

HEADER = "student,question,correct\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "answers.csv"
    path.write_text(text)
    return path


def train_error(*arguments: str) -> str:
    """Run `mnemo train kt` in process; assert it failed with one line and no traceback; return that line."""
    result = CliRunner().invoke(cli, ["train", "kt", "--artifacts", "unused", "--name", "m", *arguments])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_importing_the_cli_and_its_train_help_loads_no_torch():
    code = (
        "import sys\nfrom app.cli import main\n"
        "try:\n    main(['train', 'kt', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'app.cli imported torch'\nprint('no torch')"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--csv" in done.stdout and "--model [dkvmn|dkt]" in done.stdout and "no torch" in done.stdout


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "answers.csv: no such file"),
        ("a directory", "answers.csv: a directory, not a CSV file"),
        (b"student,question,correct\ns1,q\xe9,1\n", "answers.csv: not UTF-8 text"),
        ("", "answers.csv: the file is empty (expected a header: student, question, correct)"),
        (HEADER, "answers.csv: the header has no rows under it"),
        ("student,item,correct\ns1,q1,1\n", "answers.csv:1: missing column 'question'"),
        (HEADER + "s1,q1,1\ns1,q2,maybe\n", "answers.csv:3: column 'correct' is 'maybe', not 0, 1, true or false"),
        (HEADER + "s1,,1\n", "answers.csv:2: column 'question' is empty"),
        (HEADER + "s1,q1,1,extra\n", "answers.csv:2: more fields than the header has columns"),
        ("student,question,correct,order\ns1,q1,1,first\n", "answers.csv:2: column 'order' is 'first', not a number"),
        (
            "student,question,correct,timestamp\ns1,q1,1,2024-01-01T10:00\ns1,q1,0,yesterday\n",
            "answers.csv:3: column 'timestamp' is 'yesterday', not a number or an ISO 8601 date-time",
        ),
        ("student,question,correct,order,timestamp\ns1,q1,1,1,1\n", "give either 'order' or 'timestamp'"),
        (HEADER + "s1,q1,1\ns2,q1,0\n", "answers.csv: 2 student(s): the split by student into train"),
        (HEADER + "s1,q1,1\ns1,q2\n", "answers.csv:3: 2 field(s), the header has 3 columns"),
        (HEADER + "s1,q1,1\ns2," + "x" * 140_000 + ",1\n", "answers.csv:3: not a readable CSV (field larger than"),
        (HEADER + 's1,"q"1,1\n', "answers.csv:2: not a readable CSV (',' expected after '\"')"),
        ("student,question,correct, Student\ns1,q1,1,x\n", "answers.csv:1: column 'student' appears more than once"),
        (HEADER + "s1,q\x001,1\n", "answers.csv:2: column 'question' holds a control character"),
        ('student,question,correct,question_name\ns1,q1,1,"a\nb"\n', "answers.csv:3: column 'question_name' holds a"),
        (HEADER + f"s1,{'q' * 201},1\n", "answers.csv:2: column 'question' has 201 characters; a request's question"),
        (
            "student,question,correct,timestamp\ns1,q1,1,5\ns1,q2,0,2024-01-01T10:00\n",
            "answers.csv:3: column 'timestamp' is a date-time, but line 2 of student 's1' holds a number: give one",
        ),
    ],
)
def test_bad_csvs_get_one_line_naming_the_problem(tmp_path, text, expected):
    path = tmp_path / "answers.csv"
    if text == "a directory":
        path.mkdir()
    elif isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        write(tmp_path, text)
    assert expected in train_error("--csv", str(path))


def test_the_real_command_prints_one_line_for_a_missing_file(tmp_path):
    missing = tmp_path / "nope.csv"
    arguments = ["train", "kt", "--csv", str(missing), "--artifacts", str(tmp_path / "a"), "--name", "m"]
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.strip() == f"Error: {missing}: no such file"
    assert not (tmp_path / "a").exists()


def test_string_ids_are_numbered_in_text_order_and_answers_sorted_by_timestamp(tmp_path):
    path = write(
        tmp_path,
        "student,question,correct,timestamp,question_name,skill\n"
        "s1,q-900,true,2024-05-02T09:00:00,,Fractions\n"
        "s1,q-17,0,2024-05-01T09:00:00,Add 1/2 + 1/3,Fractions\n"
        "s2,q-17,1,5,,\n",
    )
    log = read_answer_log(path)
    assert log.question_ids == ["q-17", "q-900"]
    assert log.question_names == ["Add 1/2 + 1/3", "Fractions"]  # question_name first, else skill
    assert log.students["s1"].questions == [1, 2] and log.students["s1"].responses == [0, 1]
    assert log.students["s2"].questions == [1]


def test_integer_ids_stay_integers_in_numeric_order_and_ties_keep_file_order(tmp_path):
    path = write(tmp_path, "student,question,correct,order\ns1,100,1,2\ns1,3,0,1\ns1,20,1,1\n")
    log = read_answer_log(path)
    assert log.question_ids == [3, 20, 100]
    assert log.students["s1"].questions == [1, 2, 3]  # order 1 (3, then 20 in file order), then order 2 (100)
    leading_zero = read_answer_log(write(tmp_path, HEADER + "s1,007,1\ns1,8,0\n"))
    assert leading_zero.question_ids == ["007", "8"]  # "007" would not read back as 7: all ids are strings


def test_the_split_is_by_student_seeded_and_covers_everyone(tmp_path):
    log = read_answer_log(write_answer_log(tmp_path / "log.csv", students=40))
    splits = split_students(log, seed=3)
    assert splits == split_students(log, seed=3) != split_students(log, seed=4)
    everyone = splits["train"] + splits["valid"] + splits["test"]
    assert sorted(everyone) == sorted(log.students) and len(set(everyone)) == 40
    assert len(splits["test"]) == len(splits["valid"]) == 6


def test_semicolons_tabs_a_bom_crlf_and_the_case_or_padding_of_column_names_read_the_same(tmp_path):
    plain = read_answer_log(write(tmp_path, HEADER + "s1,q2,1\ns1,q1,0\ns2,q1,1\n"))
    spreadsheet = "\ufeff Student ;QUESTION;Correct\r\ns1;q2;1\r\ns1;q1;0\r\ns2;q1;1\r\n"
    assert read_answer_log(write(tmp_path, spreadsheet)) == plain
    assert read_answer_log(write(tmp_path, "student\tquestion\tcorrect\ns1\tq2\t1\ns1\tq1\t0\ns2\tq1\t1\n")) == plain


def test_a_timestamp_without_an_offset_is_utc_whatever_the_machines_time_zone(tmp_path, monkeypatch):
    path = write(
        tmp_path, "student,question,correct,timestamp\ns1,q1,1,2024-01-01T12:00+00:00\ns1,q2,0,2024-01-01T10:00\n"
    )
    monkeypatch.setenv("TZ", "America/New_York")  # where 10:00 local is 15:00 UTC, after the other answer
    time.tzset()
    try:
        log = read_answer_log(path)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert log.students["s1"].questions == [2, 1]  # 10:00 UTC, then 12:00 UTC


@pytest.mark.parametrize(
    ("manifest", "name", "expected"),
    [
        ("{not json", "m", "manifest.json: not a readable manifest (Expecting property name"),
        ("[]", "m", "manifest.json: not a mnemo manifest (a JSON object with schema_version 1 and a models list)"),
        ('{"schema_version": 1, "models": 3}', "m", "manifest.json: not a mnemo manifest"),
        ('{"schema_version": 2, "models": []}', "m", "manifest.json: not a mnemo manifest"),
        (None, KT_MODEL, "already names a knowledge-trace model that `mnemo train` did not train on a CSV; choose"),
        (
            '{"schema_version": 1, "models": [{"name": "m", "task": "similarity", "metadata": {"data_sha256": "0"}}]}',
            "m",
            "manifest.json already names a similarity model; choose another --name",
        ),
    ],
)
def test_an_artifacts_directory_it_cannot_update_is_refused_before_training(tmp_path, manifest, name, expected):
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    text = (COMMITTED / "manifest.json").read_text() if manifest is None else manifest  # the committed models
    (artifacts / "manifest.json").write_text(text)
    data = str(write_answer_log(tmp_path / "answers.csv", students=10))
    run = tmp_path / "run"
    assert expected in train_error("--csv", data, "--artifacts", str(artifacts), "--name", name, "--run-dir", str(run))
    assert (artifacts / "manifest.json").read_text() == text and not run.exists()


@pytest.mark.parametrize("manifest", [False, True])
def test_a_new_model_never_overwrites_a_file_of_the_same_name(tmp_path, manifest):
    (tmp_path / "README.md").write_text("mine")
    if manifest:
        (tmp_path / "manifest.json").write_text('{"schema_version": 1, "models": []}')
    data = str(write_answer_log(tmp_path / "answers.csv", students=10))
    line = train_error("--csv", data, "--artifacts", str(tmp_path), "--name", "README")
    assert line.endswith("README.md exists and is not this model's; choose another --name")
    assert (tmp_path / "README.md").read_text() == "mine"


def test_a_csv_that_is_not_a_regular_file_is_refused():
    assert (
        train_error("--csv", "/dev/null")
        == "Error: /dev/null: not a regular file (a CSV is read twice: once to check it, once to hash it)"
    )


def test_artifacts_under_a_file_are_refused_before_training(tmp_path):
    (tmp_path / "file").write_text("")
    data = str(write_answer_log(tmp_path / "answers.csv", students=10))
    line = train_error("--csv", data, "--artifacts", str(tmp_path / "file" / "artifacts"))
    assert line.endswith("artifacts: cannot write there (Not a directory)")


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_numpy_and_torch_cannot_take_is_one_line(tmp_path, seed):
    data = str(write_answer_log(tmp_path / "answers.csv", students=10))
    assert train_error("--csv", data, "--seed", seed) == f"Error: --seed {seed}: must be 0 to 4294967295"


def test_a_split_without_both_outcomes_is_told_by_the_split_before_torch_loads(tmp_path):
    log = read_answer_log(write(tmp_path, HEADER + "".join(f"s{index},q1,1\n" for index in range(10))))
    with pytest.raises(AnswerLogError, match=r"the valid split \(2 students\) has only correct answers, so its AUC"):
        split_students(log, seed=0)


def test_an_answer_log_error_names_the_file(tmp_path):
    with pytest.raises(AnswerLogError, match=r"answers.csv:2: column 'student' is empty"):
        read_answer_log(write(tmp_path, HEADER + ",q1,1\n"))


@pytest.mark.slow
def test_train_export_serve_and_answer_with_the_csvs_own_ids(tmp_path):
    """The whole path on a generated CSV with sparse string ids, into an artifacts directory that already holds a
    built-in model (so the manifest is updated, not created): train 1 epoch, export, serve, answer."""
    pytest.importorskip("torch", reason="training needs the train extra")
    artifacts = tmp_path / "artifacts"
    manifest = json.loads((COMMITTED / "manifest.json").read_text())
    builtin = next(entry for entry in manifest["models"] if entry["name"] == KT_MODEL)
    artifacts.mkdir()
    for name in [builtin["file"], *(asset["file"] for asset in builtin["assets"].values())]:
        shutil.copy(COMMITTED / name, artifacts / name)
    (artifacts / "manifest.json").write_text(json.dumps({**manifest, "models": [builtin]}))
    data = write_answer_log(tmp_path / "answers.csv")
    with data.open() as handle:
        rows = list(csv.DictReader(handle))
    own_ids = sorted({row["question"] for row in rows})
    command = [sys.executable, "-m", "app.cli", "train", "kt", "--csv", str(data), "--artifacts", str(artifacts)]
    command += ["--name", "mine", "--epochs", "1", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mine: test AUC" in done.stdout and "per-question-mean baseline" in done.stdout

    entries = {entry["name"]: entry for entry in json.loads((artifacts / "manifest.json").read_text())["models"]}
    assert set(entries) == {KT_MODEL, "mine"}
    assert entries["mine"]["default"] is not builtin["default"]  # the first knowledge-trace default of the dir
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert entries["mine"]["metrics"]["test_auc"] == round(result["test"]["auc"], 4)
    card = (artifacts / "mine.md").read_text()
    assert f"| test AUC | {result['test']['auc']:.4f} | {result['baseline_test_auc']:.4f} |" in card
    assert result["protocol"]["data"]["sha256"] in card

    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1 and "already holds a finished run evaluated on its test split" in again.stderr
    assert "Traceback" not in again.stderr

    with running_server(artifacts) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        catalog = client.get("/models/mine/questions", params={"limit": 1000}).json()
        assert [item["question"] for item in catalog["questions"]] == own_ids
        assert catalog["questions"][0]["name"] == f"Question {own_ids[0][5:]}"
        history = [{"question": row["question"], "correct": row["correct"] in ("1", "true")} for row in rows[:30]]
        body = {"model": "mine", "interactions": history, "next_questions": own_ids[:3]}
        answer = client.post("/knowledge-trace", json=body)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["predictions"]) == 30
        assert [item["question"] for item in answer.json()["next"]] == own_ids[:3]
        if entries["mine"]["default"]:
            without_model = client.post("/knowledge-trace", json={key: body[key] for key in body if key != "model"})
            assert without_model.json()["model"] == "mine"

        odd = [own_ids[0], "item-0", 7, f" {own_ids[0]}"]  # unknown, another type, padded: each named
        unknown = client.post("/knowledge-trace", json={**body, "next_questions": odd})
        assert unknown.status_code == 422
        assert [error["loc"] for error in unknown.json()["detail"]] == [
            ["body", "next_questions", 1],
            ["body", "next_questions", 2],
            ["body", "next_questions", 3],
        ]
        assert "not a question of model mine (its question ids are strings" in unknown.json()["detail"][0]["msg"]

        builtin_body = {"model": KT_MODEL, "interactions": [{"question": 3, "correct": True}], "next_questions": [4]}
        assert client.post("/knowledge-trace", json=builtin_body).json()["next"][0]["question"] == 4
        as_text = client.post("/knowledge-trace", json={**builtin_body, "next_questions": ["4"]})
        assert as_text.status_code == 422
        assert as_text.json()["detail"][0]["loc"] == ["body", "next_questions", 0]
        assert "is a string; the questions of model dkvmn-synthetic are integers" in as_text.json()["detail"][0]["msg"]


@pytest.mark.slow
def test_an_interrupted_run_resumes_only_with_resume_and_its_own_protocol(tmp_path):
    pytest.importorskip("torch", reason="training needs the train extra")
    from models.train_own_kt import Run, train

    log = read_answer_log(write_answer_log(tmp_path / "answers.csv", students=30))
    run = Run(tmp_path / "answers.csv", tmp_path / "run", "dkt", epochs=2, seed=0, progress=False)
    first = train(run, log, "test")
    assert first["epochs_run"] == 2
    assert first["recipe"]["batch"] == 22 and first["history"][0]["train_loss"] > 0  # 22 train students learn
    (run.run_dir / "result.json").unlink()  # as if stopped after its last checkpoint, before the test evaluation
    with pytest.raises(AnswerLogError, match="holds an unfinished run: pass --resume"):
        train(run, log, "test")
    with pytest.raises(AnswerLogError, match=r"--resume: .* was written for other data or settings"):
        train(replace(run, resume=True, seed=1), log, "test")
    resumed = train(replace(run, resume=True), log, "test")
    assert resumed["epochs_run"] == 2 and resumed["history"] == first["history"]
    assert resumed["test"] == first["test"]
    with pytest.raises(AnswerLogError, match="finished run evaluated on its test split: pass --resume to export it"):
        train(run, log, "test")
    again = train(replace(run, resume=True), log, "test")  # an export that failed is retried without training
    assert again["test"] == first["test"] and again["history"] == first["history"]


def test_a_manifest_update_that_fails_midway_leaves_the_old_manifest_whole(tmp_path):
    """A full disk (RLIMIT_FSIZE) while `mnemo train` adds its model keeps the manifest the service starts from."""
    before = {"schema_version": 1, "models": [{"name": "kept", "task": "knowledge-trace", "file": "kept.onnx"}]}
    (tmp_path / "manifest.json").write_text(json.dumps(before))
    (tmp_path / "new.onnx").write_bytes(b"graph")
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from export.manifest import upsert_model\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        "try:\n"
        "    upsert_model(Path(sys.argv[1]), {'name': 'new', 'task': 'knowledge-trace', 'file': 'new.onnx'})\n"
        "except OSError:\n"
        "    sys.exit(3)\n"
    )
    assert subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, check=False).returncode == 3
    assert json.loads((tmp_path / "manifest.json").read_text()) == before


def test_a_json_write_that_fails_midway_leaves_the_old_file_whole(tmp_path):
    """A full disk (here a file-size limit, RLIMIT_FSIZE) while result.json is rewritten keeps the previous one."""
    path = tmp_path / "result.json"
    path.write_text('{"kept": true}\n')
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from models.training import write_json\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        "try:\n"
        "    write_json(Path(sys.argv[1]), {'history': ['x' * 100] * 10})\n"
        "except OSError:\n"
        "    sys.exit(3)\n"
    )
    assert subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, check=False).returncode == 3
    assert json.loads(path.read_text()) == {"kept": True}
    assert list(tmp_path.iterdir()) == [path]
