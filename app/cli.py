"""The `mnemo` command: `serve` (a flag per setting, over its variable), `models`, `train` (models/own_command.py)."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import socket
import sys
import types
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from app.core.logging import JsonFormatter, TextFormatter
from app.core.manifest import ModelLoadError, chosen, load_manifest
from app.core.settings import DEFAULT_ARTIFACTS_DIR, Settings, split_list, unknown_variables
from app.students.io import check_url

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110, "show_default": True}  # for subcommands too
MAX_METRICS = 3  # test metrics shown per model in `mnemo models` (--json gives all)
CLICK_TYPES = {int: click.INT, float: click.FLOAT, Path: click.Path(path_type=Path)}  # others: str, bool a switch


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def settings_option(name: str, field: FieldInfo) -> click.Option:
    """The option of one settings field, validated by Settings; not given (None), the environment decides."""
    annotation = field.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None
        [annotation] = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    literal = typing.get_origin(annotation) is typing.Literal
    kind = click.Choice(typing.get_args(annotation), case_sensitive=False) if literal else CLICK_TYPES.get(annotation)
    flag = flag_name(name)
    shown = not field.default_factory and field.default not in (None, "")  # a computed or unset default: not shown
    help_text = " ".join((field.description or "").split()) + f" (env MNEMO_{name.upper()})"
    return click.Option(
        [f"{flag}/--no-{flag[2:]}" if annotation is bool else flag, name],
        type=kind,
        default=None,  # unset: the variable (or the field's default) holds, a switch's too
        help=help_text + (f" [default: {field.default}]" if shown else ""),
    )


def settings_from(flags: dict[str, Any]) -> Settings:
    """Settings from the flags given over the environment; a bad flag or variable exits naming it (`refuse`)."""
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as error:
        problems = []
        for problem in error.errors():  # a rule across settings (no `loc`) names them itself
            message = problem["msg"].removeprefix("Value error, ")  # pydantic's prefix of a validator's error
            where = "MNEMO_" + ".".join(map(str, problem["loc"])).upper()
            problems.append(f"{where}: {message}" if problem["loc"] else message)
        refuse(f"invalid settings: {'; '.join(problems)}", given)


def refuse(problem: str, flags: Collection[str]) -> NoReturn:
    """Exit on `problem`: naming the flags given where it names their variables (a usage error, status 2), else 1."""
    flagged = problem
    for name in flags:
        flagged = re.sub(rf"\bMNEMO_{name.upper()}\b", flag_name(name), flagged)
    if flagged != problem:
        raise click.UsageError(flagged)
    sys.exit(f"mnemo: cannot start: {problem}")


@click.group(context_settings=CONTEXT)
def cli() -> None:
    """Serve memory-augmented models (LSTM_RMC similarity, DKVMN knowledge tracing) with ONNX Runtime."""


@cli.command(context_settings=CONTEXT, params=[settings_option(*field) for field in Settings.model_fields.items()])
def serve(**flags: Any) -> None:
    """Serve the manifest's models over HTTP (and gRPC with --grpc-port)."""
    settings, given = settings_from(flags), {name for name, value in flags.items() if value is not None}
    for line in unknown_variables(os.environ):
        click.echo(f"mnemo: warning: {line}", err=True)
    try:  # the settings' files, URL, ports and models: one line and exit if wrong
        entries = chosen(load_manifest(settings.artifacts_dir).models, split_list(settings.models))
        check_url(settings.state_url)
        for name in ("probe_port", "grpc_port", "port"):
            with socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds it
                try:
                    if (port := getattr(settings, name)) is not None:
                        sock.bind((settings.host, port))
                except OSError as error:  # in use, or a host that does not resolve
                    where = f"{settings.address(port)} (MNEMO_HOST:MNEMO_{name.upper()})"
                    raise ValueError(f"cannot listen on {where}: {error.strerror}") from None
    except ModelLoadError as error:  # it names the flag and the variable
        sys.exit(f"mnemo: cannot start: {error}")
    except ValueError as error:
        refuse(str(error), given)
    grpc = f", gRPC on {settings.address(settings.grpc_port)}" if settings.grpc_port else ""
    names = ", ".join(entry.name for entry in entries) or "no models"
    formatter = JsonFormatter() if settings.log_format == "json" else TextFormatter()
    where = f"http://{settings.address(settings.port)}{grpc}"
    line = logging.LogRecord("mnemo", logging.INFO, __file__, 0, "serving %s on %s", (names, where), None)
    click.echo(formatter.format(line), err=True)  # in the log's format: a JSON log stays JSON lines
    from app.server import Gunicorn  # gunicorn and uvicorn, once the settings are known to be good

    Gunicorn(settings).run()


@cli.command()
@click.option(
    "--artifacts-dir",
    "--artifacts",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_ARTIFACTS_DIR,
    envvar="MNEMO_ARTIFACTS_DIR",
    show_envvar=True,
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
    for entry in manifest.models:
        files = [entry.file, *(part.file for part in [*entry.graphs.values(), *entry.assets.values()])]
        size = sum((artifacts_dir / name).stat().st_size for name in files if (artifacts_dir / name).is_file())
        tested = [(key, value) for key, value in entry.metrics.items() if key.startswith("test_")][:MAX_METRICS]
        metrics = ", ".join(f"{key.removeprefix('test_')} {value:.4g}" for key, value in tested if value is not None)
        default = "yes" if entry.default else ""
        table.append([entry.name, entry.task, entry.version, default, f"{size / 1e6:.1f} MB", metrics])
    widths = [max(len(cell) for cell in column) for column in zip(*table, strict=True)]
    for line in table:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True}, add_help_option=False)
@click.pass_context
def train(context: click.Context) -> None:
    """Train a model on your own data, export it to ONNX and add it to a manifest (needs the `train` extra)."""
    try:
        from models.own_command import train  # numpy only: torch loads when a run starts
    except ImportError as error:
        raise click.ClickException(f"training needs the project's models/ package: {error}") from None
    train.main(context.args, prog_name=context.command_path)


main = functools.partial(cli.main, prog_name="mnemo")  # the `mnemo` console script: main(args=sys.argv[1:])

if __name__ == "__main__":
    main()
