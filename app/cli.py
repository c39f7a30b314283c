"""The `mnemo` command: `mnemo serve` (one flag per `Settings` field, winning over its variable), `mnemo models`
(what a manifest holds) and `mnemo train` (a model on your own data; it imports torch only when it runs)."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo

from app.core.logging import JsonFormatter, TextFormatter
from app.core.manifest import ManifestError, ModelEntry, chosen, load_manifest
from app.core.settings import DEFAULT_ARTIFACTS_DIR, Settings, split_list, unknown_variables
from app.students.factory import check_url

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
MAX_METRICS = 3  # test metrics shown per model in `mnemo models` (--json gives all)


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _click_type(annotation: Any) -> tuple[Any, bool]:
    """The click type of a settings field, and whether it is a boolean flag."""
    arguments = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(arguments) == 1:
        annotation = arguments[0]
    if typing.get_origin(annotation) is typing.Literal:
        return click.Choice([str(choice) for choice in typing.get_args(annotation)], case_sensitive=False), False
    if annotation is bool:
        return bool, True
    if annotation is Path:
        return click.Path(path_type=Path), False
    if annotation in (int, float):
        return annotation, False
    return str, False  # str, SecretStr


def _all_of(*decorators: Callable[[Callable], Callable]) -> Callable[[Callable], Callable]:
    """One decorator applying `decorators` as if stacked in that order (click lists options in it)."""
    return lambda command: functools.reduce(
        lambda decorated, decorator: decorator(decorated), reversed(decorators), command
    )


def _settings_option(name: str, field: FieldInfo) -> Callable[[Callable], Callable]:
    """The option of one settings field; not given (None), the environment decides."""
    kind, is_flag = _click_type(field.annotation)
    declaration = f"{flag_name(name)}/--no-{name.replace('_', '-')}" if is_flag else flag_name(name)
    default = field.default
    hidden = field.default_factory is not None or default in (None, "") or isinstance(default, SecretStr)
    help_text = f"{' '.join((field.description or '').split())} (env MNEMO_{name.upper()})" + (
        "" if hidden else f" [default: {default}]"
    )
    return click.option(declaration, name, type=None if is_flag else kind, default=None, help=help_text)


def settings_from(flags: dict[str, Any]) -> Settings:
    """Settings from the given flags over the environment: a flag's invalid value exits 2 naming the flag, a
    variable's exits 1 naming the variable."""
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as error:
        flagged = [problem for problem in error.errors() if problem["loc"] and problem["loc"][0] in given]
        if flagged:
            raise click.UsageError("; ".join(_problem(problem, flag_name) for problem in flagged)) from None
        problems = "; ".join(_problem(problem, lambda name: f"MNEMO_{name.upper()}") for problem in error.errors())
        sys.exit(f"mnemo: cannot start: invalid settings: {problems}")


def _problem(error: Any, named: Callable[[str], str]) -> str:
    """One settings error: `name: message`, or a rule across settings (it names them itself) alone."""
    message = str(error["msg"]).removeprefix("Value error, ")  # pydantic's prefix of a validator's ValueError
    return f"{named('.'.join(map(str, error['loc'])))}: {message}" if error["loc"] else message


def start(settings: Settings) -> None:
    """Check what the settings name (files, URLs, ports, models: one line and exit 1 if wrong), say where the
    service listens, then serve. This process imports no ONNX Runtime: gunicorn forks the workers from it."""
    for line in unknown_variables(os.environ):
        click.echo(f"mnemo: warning: {line}", err=True)
    try:
        problem = startup_problem(settings)
        entries = chosen(load_manifest(settings.artifacts_dir).models, split_list(settings.models))
    except ManifestError as error:
        problem = problem or str(error)
    if problem is not None:
        sys.exit(f"mnemo: cannot start: {problem}")
    grpc = f", gRPC on {settings.host}:{settings.grpc_port}" if settings.grpc_port else ""
    where = f"http://{settings.host}:{settings.port}{grpc}"
    names = ", ".join(entry.name for entry in entries) or "no models"
    formatter = JsonFormatter() if settings.log_format == "json" else TextFormatter()
    line = logging.LogRecord("mnemo", logging.INFO, __file__, 0, "serving %s on %s", (names, where), None)
    click.echo(formatter.format(line), err=True)  # in the log's format: a JSON log stays JSON lines
    from app.server import serve  # gunicorn and uvicorn, once the settings are known to be good

    serve(settings)


def startup_problem(settings: Settings) -> str | None:
    """What is wrong with settings that only make sense together with the files, URLs and ports they name."""
    if not (settings.artifacts_dir / "manifest.json").is_file():
        return f"MNEMO_ARTIFACTS_DIR {settings.artifacts_dir} holds no manifest.json"
    try:
        check_url(settings.state_url)
    except ValueError as error:
        return str(error)
    for name in ("probe_port", "grpc_port", "port"):
        port = getattr(settings, name)
        with socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds it
            try:
                if port is not None:
                    sock.bind((settings.host, port))
            except OSError as error:  # in use, or a host that does not resolve
                where = f"{settings.host}:{port} (MNEMO_HOST:MNEMO_{name.upper()})"
                return f"cannot listen on {where}: {error.strerror}"
    return None


@click.group(context_settings=CONTEXT)
def cli() -> None:
    """Serve memory-augmented models (LSTM_RMC similarity, DKVMN knowledge tracing) with ONNX Runtime."""


@cli.command(context_settings=CONTEXT)
@_all_of(*(_settings_option(name, field) for name, field in Settings.model_fields.items()))
def serve(**flags: Any) -> None:
    """Serve the manifest's models over HTTP (and gRPC with --grpc-port)."""
    start(settings_from(flags))


@cli.command(context_settings=CONTEXT)
@click.option(
    "--artifacts-dir",
    "--artifacts",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_ARTIFACTS_DIR,
    show_default=True,
    help="Directory holding manifest.json.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON instead of a table.")
def models(artifacts_dir: Path, as_json: bool) -> None:
    """The models of a manifest: name, task, version, default, metrics and file size."""
    try:
        manifest = load_manifest(artifacts_dir)
    except Exception as error:
        raise click.ClickException(str(error)) from None
    if as_json:
        click.echo(json.dumps([entry.model_dump(mode="json") for entry in manifest.models], indent=2))
        return
    table = [["name", "task", "version", "default", "size", "metrics"]]
    table += [_model_row(artifacts_dir, entry) for entry in manifest.models]
    widths = [max(len(cell) for cell in column) for column in zip(*table, strict=True)]
    for line in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())


def _model_row(artifacts_dir: Path, entry: ModelEntry) -> list[str]:
    files = [entry.file, *(graph.file for graph in entry.graphs.values())]
    files += [asset.file for asset in entry.assets.values()]
    size = sum((artifacts_dir / name).stat().st_size for name in files if (artifacts_dir / name).is_file())
    tested = [(key, value) for key, value in entry.metrics.items() if key.startswith("test_")][:MAX_METRICS]
    metrics = ", ".join(f"{key.removeprefix('test_')} {value:.4g}" for key, value in tested)
    return [entry.name, entry.task, entry.version, "yes" if entry.default else "", f"{size / 1e6:.1f} MB", metrics]


@cli.group(context_settings=CONTEXT)
def train() -> None:
    """Train a model on your own data, export it to ONNX and add it to a manifest (needs the `train` extra)."""


def _model_name(context: click.Context, parameter: click.Parameter, value: str) -> str:
    from models.cli import MODEL_NAME  # models/ loads only when a train command runs

    if MODEL_NAME.fullmatch(value) is None:
        raise click.BadParameter("1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or digit")
    return value


def _own_data_options(csv_help: str) -> Callable[[Callable], Callable]:
    """The options every `mnemo train` command takes (`--csv` described by `csv_help`)."""
    return _all_of(
        click.option("--csv", "csv_file", required=True, type=click.Path(path_type=Path), help=csv_help),
        click.option(
            "--artifacts",
            required=True,
            type=click.Path(path_type=Path, file_okay=False),
            help="Directory to write the model into; its manifest.json is created or updated.",
        ),
        click.option(
            "--name", required=True, callback=_model_name, help="The served model's name (and its files' stem)."
        ),
        click.option("--epochs", type=click.IntRange(min=1), default=30, show_default=True, help="Maximum epochs."),
        click.option(
            "--seed", type=int, default=1024, show_default=True, help="Seed of the split, weights and shuffling."
        ),
        click.option(
            "--run-dir",
            type=click.Path(path_type=Path, file_okay=False),
            default=None,
            help="Checkpoints and the run record.  [default: runs/own/NAME]",
        ),
        click.option("--resume", is_flag=True, help="Continue the unfinished run in --run-dir from its last epoch."),
        click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Torch CPU threads."),
        click.option("--no-progress", is_flag=True, help="No progress bar (for log files)."),
    )


def _train(task: str, **options: Any) -> None:
    """Run `mnemo train TASK` (models/own_command.py); a problem the user can fix is one line, never a traceback."""
    try:
        from models.own_command import run_own_training
        from models.user_csv import OwnDataError
    except ImportError as error:
        raise click.ClickException(f"training needs the project's models/ package: {error}") from None
    try:
        click.echo(run_own_training(task, **options))
    except OwnDataError as error:
        raise click.ClickException(str(error)) from None


@train.command(name="kt", context_settings=CONTEXT)
@_own_data_options(
    "Answer log with a header: student, question, correct (0/1/true/false); optional order or timestamp, "
    "question_name, skill."
)
@click.option(
    "--model",
    type=click.Choice(["dkvmn", "dkt"]),
    default="dkvmn",
    show_default=True,
    help="DKVMN (memory slots) or DKT (an LSTM).",
)
def train_kt(**options: Any) -> None:
    """Train knowledge tracing on your answer log: split by student, select on validation, test once, export to
    ONNX (parity-checked) with its card, and add it to ARTIFACTS/manifest.json. Serve it with
    `MNEMO_ARTIFACTS_DIR=ARTIFACTS mnemo serve`; requests use the CSV's own question ids."""
    _train("kt", **options)


@train.command(name="similarity", context_settings=CONTEXT)
@_own_data_options(
    "Scored sentence pairs with a header: sentence_a, sentence_b, score (relatedness, 1..5); optional label "
    "(ENTAILMENT, NEUTRAL or CONTRADICTION, any case)."
)
def train_similarity(**options: Any) -> None:
    """Train the LSTM_RMC pair model on your scored sentence pairs: split by pair, select on validation, test
    once, export to ONNX (parity-checked) with its card, and add it to ARTIFACTS/manifest.json. Serve it with
    `MNEMO_ARTIFACTS_DIR=ARTIFACTS mnemo serve`; without a label column it answers relatedness only."""
    _train("similarity", **options)


def main(argv: list[str] | None = None) -> None:
    """The `mnemo` console script."""
    cli.main(args=argv, prog_name="mnemo")


if __name__ == "__main__":
    main(sys.argv[1:])
