"""`artifacts/manifest.json`: its schema and checks, one line per problem; its files confined and sha256-checked."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

from pydantic import AllowInfNan, BaseModel, Field, FiniteFloat, ValidationError

from app.core.errors import printable
from app.core.integrity import sha256_of

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class ModelLoadError(RuntimeError):
    """The manifest, or a model it lists, cannot be served; the message names the entry, the field or the file."""


class AssetEntry(BaseModel, extra="forbid"):  # every part of the manifest: an unknown field (a typo) is an error
    file: str = Field(min_length=1)
    sha256: str = Field(pattern=SHA256_PATTERN)


class BatchingOverride(BaseModel, extra="forbid"):
    """Per-model overrides of MNEMO_MAX_BATCH, MNEMO_MAX_WAIT_MS, MNEMO_MAX_QUEUE, and a cap on padded cells."""

    max_batch: int | None = Field(None, ge=1, le=4096)
    max_wait_ms: FiniteFloat | None = Field(None, ge=0, le=1000)
    max_queue: int | None = Field(None, ge=1)
    max_cells: int | None = Field(None, ge=1, description="padded rows x length per run (steps or tokens)")


class ModelEntry(BaseModel, extra="forbid"):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    task: str
    version: str = Field(min_length=1, max_length=64)
    file: str = Field(min_length=1)
    sha256: str = Field(pattern=SHA256_PATTERN)
    default: bool = False
    limits: dict[str, int] = {}
    metrics: dict[str, Annotated[float | int | None, AllowInfNan(False)]] = {}  # no NaN or Infinity: not a measurement
    metadata: dict[str, Any] = {}
    assets: dict[str, AssetEntry] = {}
    graphs: dict[str, AssetEntry] = {}  # more ONNX graphs of the same weights (e.g. the encoder alone), by task key
    batching: BatchingOverride = BatchingOverride()
    card: str | None = None


class Manifest(BaseModel, extra="forbid"):
    schema_version: int = Field(1, ge=1, le=1)
    models: list[ModelEntry]


def load_manifest(artifacts: Path) -> Manifest:
    """`artifacts/manifest.json` read and checked against the schema (ModelLoadError otherwise)."""
    path = artifacts / "manifest.json"
    try:
        if not path.is_file():
            raise ModelLoadError(
                f"no manifest.json in {artifacts}: set MNEMO_ARTIFACTS_DIR (--artifacts-dir) to a directory that has "
                "one, such as a checkout's artifacts/ (the committed models, which `make serve` serves)"
            )
        raw = json.loads(path.read_text())
        return Manifest.model_validate(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:  # RecursionError: nested too deep
        raise ModelLoadError(f"manifest.json is not JSON: {error}") from None
    except OSError as error:
        raise ModelLoadError(f"cannot read {path}: {error.strerror}") from None
    except ValidationError as error:
        problems = "; ".join(_problem(raw, e["loc"], e["msg"]) for e in error.errors(include_url=False)[:10])
        raise ModelLoadError(f"manifest.json does not match the schema: {problems}") from None


def _problem(raw: Any, loc: tuple, message: str) -> str:
    """`models.1.batching.max_wait_ms: <rule> (model <name>)`: where, the rule broken, and the entry's name."""
    entry = raw["models"][loc[1]] if loc[:1] == ("models",) and len(loc) > 2 else None
    name = f" (model {entry['name']})" if isinstance(entry, dict) and isinstance(entry.get("name"), str) else ""
    return printable(f"{'.'.join(map(str, loc)) or 'the manifest'}: {message}{name}", None)


def read_manifest(artifacts: Path, tasks: set[str]) -> list[ModelEntry]:
    """The entries of `artifacts/manifest.json`, checked: schema, known tasks, unique names, one default per task."""
    models = load_manifest(artifacts).models
    if twice := sorted(name for name, count in Counter(entry.name for entry in models).items() if count > 1):
        raise ModelLoadError(f"manifest.json: model names must be unique, not {', '.join(twice)} (listed twice)")
    for entry in models:
        if entry.task not in tasks:
            raise ModelLoadError(
                f"manifest.json: model {entry.name} has unknown task {entry.task!r}; known: {', '.join(sorted(tasks))}"
            )
        defaults = [other.name for other in models if other.task == entry.task and other.default]
        if len(defaults) > 1:
            raise ModelLoadError(f"manifest.json: at most one default {entry.task} model, not {', '.join(defaults)}")
    return models


def positive_int(values: dict[str, Any], key: str) -> int:
    """`values[key]` when it is a positive integer (a task's limit or size in the manifest), else ValueError."""
    value = values.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key} must be a positive integer, not {value!r}")
    return value


def verified(artifacts: Path, listed: AssetEntry | ModelEntry, what: str) -> Path:
    """A listed file's path, once inside `artifacts` (no absolute path, `..` or symlink out) with the listed sha256."""
    root, name = artifacts.resolve(), listed.file
    if Path(name).is_absolute():
        raise ModelLoadError(f"file {Path(name).name!r} must be relative to the artifacts directory (no absolute path)")
    if not (path := (root / name).resolve()).is_relative_to(root):
        raise ModelLoadError(f"file {name!r} leads outside the artifacts directory")
    if not path.is_file():
        raise ModelLoadError(f"{what} {name} is missing")
    if (actual := sha256_of(path)) != listed.sha256:
        raise ModelLoadError(
            f"{what} {name} has sha256 {actual}, but the manifest says {listed.sha256}; refusing to serve it"
        )
    return path


def chosen(entries: list[ModelEntry], names: list[str]) -> list[ModelEntry]:
    """The entries named by `--models`/MNEMO_MODELS (all when empty); an unknown name is an error naming the choices."""
    known = {entry.name for entry in entries}
    if unknown := [name for name in names if name not in known]:
        raise ModelLoadError(
            f"--models/MNEMO_MODELS names {printable(', '.join(unknown))}, which the manifest does not have; "
            f"its models: {', '.join(sorted(known))}"
        )
    return [entry for entry in entries if not names or entry.name in names]
