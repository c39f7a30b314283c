"""The training and export commands refuse bad arguments with one argparse error naming the option (exit 2), instead
of a traceback from inside the run or a run that silently does something else (`--epochs 0` ran the default
schedule, `--batch -4` trained on nothing, `--name ../x` wrote files outside the artifacts directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the training commands need the train extra")

from export.cards import exporter_parser
from models import train_kt, train_sim


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--dataset", "nope"], "argument --dataset: unknown data set 'nope'"),
        (["--dataset", "synthetic-vx"], "argument --dataset: unknown data set"),
        (["--dataset", "synthetic-v0", "--epochs", "0"], "argument --epochs: must be at least 1, not 0"),
        (["--dataset", "synthetic-v0", "--patience", "-1"], "argument --patience: must be at least 1"),
        (["--dataset", "synthetic-v0", "--threads", "0"], "argument --threads: must be at least 1"),
        (["--dataset", "synthetic-v0", "--lr", "-1"], "argument --lr: must be above 0"),
        (["--dataset", "synthetic-v0", "--dropout", "1.5"], "argument --dropout: must be at least 0 and below 1"),
        (["--dataset", "synthetic-v0", "--memory-size", "0"], "argument --memory-size: must be at least 1"),
    ],
)
def test_train_kt_refuses_bad_arguments_naming_the_option(arguments, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        train_kt.build_parser().parse_args(arguments)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--batch", "-4"], "argument --batch: must be at least 1, not -4"),
        (["--epochs", "0"], "argument --epochs: must be at least 1"),
        (["--threads", "two"], "argument --threads: 'two' is not a number"),
        (["--dropout-entailment", "1"], "argument --dropout-entailment: must be at least 0 and below 1"),
    ],
)
def test_train_sim_refuses_bad_arguments_naming_the_option(arguments, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        train_sim.build_parser().parse_args(arguments)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_exporters_take_only_training_runs_and_model_names(tmp_path: Path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    parser = exporter_parser("test", "knowledge-trace")
    with pytest.raises(SystemExit):
        parser.parse_args(["--run", str(run), "--name", "ok"])
    assert "is not a training run directory (no result.json in it)" in capsys.readouterr().err
    (run / "result.json").write_text("{}")
    for name in ("../escaped", "", ".hidden", "a/b", "x" * 65):
        with pytest.raises(SystemExit):
            parser.parse_args(["--run", str(run), "--name", name])
        assert "is not a model name" in capsys.readouterr().err
    assert parser.parse_args(["--run", str(run), "--name", "dkvmn-new.v2"]).name == "dkvmn-new.v2"


def test_a_run_directory_that_is_a_file_is_refused(tmp_path: Path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for parser, arguments in (
        (train_kt.build_parser(), ["--dataset", "synthetic-v0", "--out", str(a_file)]),
        (train_sim.build_parser(), ["--out", str(a_file)]),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args(arguments)
        assert f"argument --out: {a_file} is a file, not a run directory" in capsys.readouterr().err


def test_a_run_directory_holding_a_run_needs_resume_or_overwrite(tmp_path: Path, capsys):
    """Training into it without --resume overwrote the earlier run without a word."""
    (tmp_path / "last.pt").write_bytes(b"an earlier run")
    for main, arguments in ((train_kt.main, ["--dataset", "synthetic-v0"]), (train_sim.main, [])):
        with pytest.raises(SystemExit):
            main([*arguments, "--out", str(tmp_path)])
        assert (
            f"{tmp_path} holds an earlier run (last.pt): --resume continues it, --overwrite" in capsys.readouterr().err
        )
        with pytest.raises(SystemExit):
            main([*arguments, "--out", str(tmp_path), "--resume", "--overwrite"])
        assert "not allowed with argument" in capsys.readouterr().err


def test_cv_kt_refuses_train_kt_options_it_sets_per_fold(tmp_path: Path, capsys):
    """`--fold 2` or `--out` after `--` were silently replaced by each fold's own."""
    from models import cv_kt

    for option in (["--fold", "2"], ["--out", str(tmp_path / "elsewhere")], ["--resume"]):
        with pytest.raises(SystemExit) as stopped:
            cv_kt.main(["--out", str(tmp_path / "run"), "--", "--dataset", "synthetic-v0", *option])
        assert stopped.value.code == 2 and f"{option[0]} after --" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before any fold trained
