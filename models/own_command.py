"""`mnemo train kt` and `mnemo train similarity` (app/cli.py loads them when they run): read and check the user's
CSV before torch loads, train with a fixed protocol, export into the artifacts directory, and say what was
written. Every problem the user can fix is one line (`OwnDataError`), never a traceback."""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import click

from export.manifest import MANIFEST_NAME, SCHEMA_VERSION, load_manifest
from models.cli import MODEL_NAME
from models.user_csv import OwnDataError


@dataclass(frozen=True)
class OwnTask:
    """Where a task's pieces live: the CSV's reader and splitter ("module:function", numpy only), the trainer
    module (`Run`, `train`, `held_out`, `summary`) and the exporter module (`export_run`)."""

    reader: str
    splitter: str
    trainer: str
    exporter: str
    served_task: str  # the manifest's `task` of the exported model


TASKS = {
    "kt": OwnTask(
        "models.answer_log:read_answer_log",
        "models.answer_log:split_students",
        "models.train_own_kt",
        "export.own_kt",
        "knowledge-trace",
    ),
    "similarity": OwnTask(
        "models.scored_pairs:read_scored_pairs",
        "models.scored_pairs:split_pairs",
        "models.train_own_similarity",
        "export.own_similarity",
        "similarity",
    ),
}
DEFAULT_RUN_DIR = Path("runs/own")
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds


def run_own_training(task: str, csv_file: Path, artifacts: Path, name: str, **options: Any) -> str:
    """Train and export a `task` model on `csv_file`; return the line that reports it. `options`: epochs, seed,
    run_dir, resume, threads, no_progress and the task's own (kt: model)."""
    own = TASKS[task]
    if not 0 <= options["seed"] <= MAX_SEED:
        raise OwnDataError(f"--seed {options['seed']}: must be 0 to {MAX_SEED}")
    data = function(own.reader)(csv_file)  # a bad CSV, or one too small to split, is told before torch loads
    try:
        function(own.splitter)(data, options["seed"])
    except OwnDataError as error:
        raise OwnDataError(f"{csv_file}: {error}") from None
    check_artifacts(artifacts, name, own.served_task)  # before training, not after it
    try:
        trainer, exporter = import_module(own.trainer), import_module(own.exporter)
    except ImportError as error:
        raise OwnDataError(f"training needs the `train` extra (pip install 'mnemo[train]'): {error}") from None
    run_dir = options.pop("run_dir") or DEFAULT_RUN_DIR / name
    settings = {key: options.pop(key) for key in ("epochs", "seed", "threads", "resume")}
    progress = not options.pop("no_progress")
    run = trainer.Run(csv=csv_file, run_dir=run_dir, progress=progress, **settings, **options)
    command = train_command(task, csv_file, artifacts, name, settings["epochs"], settings["seed"], **options)
    try:
        result = trainer.train(run, data, command)
        entry = exporter.export_run(run_dir, result, trainer.held_out(data, result), artifacts, name)
    except KeyboardInterrupt:
        raise OwnDataError(f"interrupted: rerun the same command with --resume ({run_dir})") from None
    except OSError as error:
        raise OwnDataError(
            f"cannot use {error.filename or artifacts} ({error.strerror}): fix it, then rerun the same command "
            f"with --resume ({run_dir})"
        ) from None
    return (
        f"{name}: {trainer.summary(result)}; wrote {artifacts / entry['file']} and {artifacts / 'manifest.json'}; "
        f"serve it with MNEMO_ARTIFACTS_DIR={artifacts} mnemo serve"
    )


def check_artifacts(artifacts: Path, name: str, task: str) -> None:
    """Refuse an artifacts directory that cannot be written or whose manifest.json this command cannot update,
    a `name` that the manifest already gives to a model of another task or to one not trained by `mnemo train`
    (a model retrained under its own name is replaced), and a new `name` whose files exist."""
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=artifacts):
            pass
    except OSError as error:
        raise OwnDataError(f"--artifacts {artifacts}: cannot write there ({error.strerror})") from None
    path = artifacts / MANIFEST_NAME
    written = [artifacts / f"{name}{suffix}" for suffix in (".onnx", ".md")]  # what every exporter writes
    try:
        manifest = load_manifest(artifacts)  # an absent one is empty
    except (OSError, ValueError) as error:
        raise OwnDataError(f"{path}: not a readable manifest ({error})") from None
    models = manifest.get("models") if isinstance(manifest, dict) else None
    if not isinstance(models, list) or manifest.get("schema_version") != SCHEMA_VERSION:
        raise OwnDataError(
            f"{path}: not a mnemo manifest (a JSON object with schema_version {SCHEMA_VERSION} and a models list)"
        )
    named = [entry for entry in models if isinstance(entry, dict) and entry.get("name") == name]
    for entry in named:
        metadata = entry.get("metadata")
        if entry.get("task") != task:
            kind = f"a {entry.get('task')} model"
        elif not isinstance(metadata, dict) or "data_sha256" not in metadata:
            kind = f"a {task} model that `mnemo train` did not train on a CSV"
        else:
            continue  # a model retrained under its own name is replaced
        raise OwnDataError(f"--name {name}: {path} already names {kind}; choose another --name")
    if not named:
        _refuse_overwriting(written, name)


def _refuse_overwriting(files: list[Path], name: str) -> None:
    """Refuse a new model whose files would replace files that are no model's (a README.md, say)."""
    taken = [file for file in files if file.exists()]
    if taken:
        raise OwnDataError(f"--name {name}: {taken[0]} exists and is not this model's; choose another --name")


def function(name: str) -> Callable:
    """The function named "module:function"."""
    module, attribute = name.split(":")
    return getattr(import_module(module), attribute)


def train_command(task: str, csv_file: Path, artifacts: Path, name: str, epochs: int, seed: int, **more: Any) -> str:
    """The command line that reproduces a training run, for its card."""
    given = {"--csv": csv_file, "--artifacts": artifacts, "--name": name, "--epochs": epochs, "--seed": seed}
    given |= {f"--{key}": value for key, value in more.items()}
    return shlex.join(["mnemo", "train", task, *(f"{flag}={value}" for flag, value in given.items())])


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110, "show_default": True})
def train() -> None:
    """Train a model on your own data, export it to ONNX and add it to a manifest (needs the `train` extra)."""


def _model_name(context: click.Context, parameter: click.Parameter, value: str) -> str:
    if MODEL_NAME.fullmatch(value) is None:
        raise click.BadParameter("1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or digit")
    return value


def own_data_options(csv_help: str) -> list[click.Option]:
    """The options every `mnemo train` command takes (`--csv` described by `csv_help`)."""
    directory = click.Path(path_type=Path, file_okay=False)
    return [
        click.Option(["--csv", "csv_file"], required=True, type=click.Path(path_type=Path), help=csv_help),
        click.Option(
            ["--artifacts"],
            required=True,
            type=directory,
            help="Directory to write the model into; its manifest.json is created or updated.",
        ),
        click.Option(
            ["--name"], required=True, callback=_model_name, help="The served model's name (and its files' stem)."
        ),
        click.Option(["--epochs"], type=click.IntRange(min=1), default=30, help="Maximum epochs."),
        click.Option(["--seed"], default=1024, help="Seed of the split, weights and shuffling."),
        click.Option(["--run-dir"], type=directory, help="Checkpoints and the run record.  [default: runs/own/NAME]"),
        click.Option(["--resume"], is_flag=True, help="Continue the unfinished run in --run-dir from its last epoch."),
        click.Option(["--threads"], type=click.IntRange(min=1), default=1, help="Torch CPU threads."),
        click.Option(["--no-progress"], is_flag=True, help="No progress bar (for log files)."),
    ]


def _train(task: str, **options: Any) -> None:
    try:
        click.echo(run_own_training(task, **options))
    except OwnDataError as error:
        raise click.ClickException(str(error)) from None


KT_CSV = (
    "Answer log with a header: student, question, correct (0/1/true/false); optional order or timestamp, "
    "question_name, skill."
)
SIMILARITY_CSV = (
    "Scored sentence pairs with a header: sentence_a, sentence_b, score (relatedness, 1..5); optional label "
    "(ENTAILMENT, NEUTRAL or CONTRADICTION, any case)."
)


@train.command(name="kt", params=own_data_options(KT_CSV))
@click.option(
    "--model", type=click.Choice(["dkvmn", "dkt"]), default="dkvmn", help="DKVMN (memory slots) or DKT (an LSTM)."
)
def train_kt(**options: Any) -> None:
    """Train knowledge tracing on your answer log (split by student, tested once), export it to ONNX (parity-checked)
    with its card into ARTIFACTS/manifest.json; requests use the CSV's own question ids."""
    _train("kt", **options)


@train.command(name="similarity", params=own_data_options(SIMILARITY_CSV))
def train_similarity(**options: Any) -> None:
    """Train the LSTM_RMC pair model on your scored sentence pairs (split by pair, tested once), export it to ONNX
    (parity-checked) with its card into ARTIFACTS/manifest.json; without a label column it answers relatedness only."""
    _train("similarity", **options)
