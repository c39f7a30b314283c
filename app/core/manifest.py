"""`artifacts/manifest.json`: its schema and checks, one line per problem; files confined to the artifacts dir."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, ValidationError

from app.core.errors import printable

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class ManifestError(RuntimeError):
    """The manifest cannot be used; the message names the entry and the field."""


class Strict(BaseModel):
    """A manifest part: an unknown field (a typo) is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class AssetEntry(Strict):
    file: str = Field(min_length=1)
    sha256: str = Field(pattern=SHA256_PATTERN)


class BatchingOverride(Strict):
    """Per-model overrides of MNEMO_MAX_BATCH, MNEMO_MAX_WAIT_MS, MNEMO_MAX_QUEUE, and a cap on padded cells."""

    max_batch: int | None = Field(None, ge=1, le=4096)
    max_wait_ms: FiniteFloat | None = Field(None, ge=0, le=1000)
    max_queue: int | None = Field(None, ge=1)
    max_cells: int | None = Field(None, ge=1, description="padded rows x length per run (steps or tokens)")


class ModelEntry(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    task: str
    version: str = Field(min_length=1, max_length=64)
    file: str = Field(min_length=1)
    sha256: str = Field(pattern=SHA256_PATTERN)
    default: bool = False
    limits: dict[str, int] = {}
    metrics: dict[str, float | int | None] = {}
    metadata: dict[str, Any] = {}
    assets: dict[str, AssetEntry] = {}
    graphs: dict[str, AssetEntry] = {}  # more ONNX graphs of the same weights (e.g. the encoder alone), by task key
    batching: BatchingOverride = BatchingOverride()
    card: str | None = None


class Manifest(Strict):
    schema_version: int = Field(1, ge=1, le=1)
    models: list[ModelEntry]


def load_manifest(artifacts: Path) -> Manifest:
    """`artifacts/manifest.json` read and checked against the schema (ManifestError otherwise)."""
    path = artifacts / "manifest.json"
    if not path.is_file():
        raise ManifestError(
            f"no manifest.json in {artifacts}: set MNEMO_ARTIFACTS_DIR (--artifacts-dir) to a directory that has one, "
            "such as a checkout's artifacts/ (the committed models, which `make serve` serves)"
        )
    try:
        raw = json.loads(path.read_text())
        return Manifest.model_validate(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ManifestError(f"manifest.json is not JSON: {error}") from None
    except OSError as error:
        raise ManifestError(f"cannot read {path}: {error.strerror}") from None
    except ValidationError as error:
        problems = "; ".join(_problem(raw, e["loc"], e["msg"]) for e in error.errors(include_url=False)[:10])
        raise ManifestError(f"manifest.json does not match the schema: {problems}") from None


def _problem(raw: Any, loc: tuple, message: str) -> str:
    """`models.1.batching.max_wait_ms: <rule> (model <name>)`: where, the rule broken, and the entry's name."""
    entry = raw["models"][loc[1]] if loc[:1] == ("models",) and len(loc) > 2 else None
    name = f" (model {entry['name']})" if isinstance(entry, dict) and isinstance(entry.get("name"), str) else ""
    return f"{'.'.join(map(str, loc)) or 'the manifest'}: {message}{name}"


def read_manifest(artifacts: Path, tasks: set[str]) -> list[ModelEntry]:
    """The entries of `artifacts/manifest.json`, checked: schema, known tasks, unique names, one default per task."""
    models = load_manifest(artifacts).models
    if twice := sorted(name for name, count in Counter(entry.name for entry in models).items() if count > 1):
        raise ManifestError(f"manifest.json: model names must be unique, not {', '.join(twice)} (listed twice)")
    for entry in models:
        if entry.task not in tasks:
            raise ManifestError(
                f"manifest.json: model {entry.name} has unknown task {entry.task!r}; known: {', '.join(sorted(tasks))}"
            )
        defaults = [other.name for other in models if other.task == entry.task and other.default]
        if len(defaults) > 1:
            raise ManifestError(f"manifest.json: at most one default {entry.task} model, not {', '.join(defaults)}")
    return models


def positive_int(values: dict[str, Any], key: str) -> int:
    """`values[key]` when it is a positive integer (a task's limit or size in the manifest), else ValueError."""
    value = values.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key} must be a positive integer, not {value!r}")
    return value


def confined(artifacts: Path, name: str) -> Path:
    """`artifacts / name`, refusing absolute paths and anything (`..`, symlinks) that resolves outside it."""
    root = artifacts.resolve()
    if Path(name).is_absolute():
        raise ManifestError(f"file {Path(name).name!r} must be relative to the artifacts directory (no absolute path)")
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ManifestError(f"file {name!r} leads outside the artifacts directory")
    return path


def chosen(entries: list[ModelEntry], names: list[str]) -> list[ModelEntry]:
    """The entries named by `--models`/MNEMO_MODELS (all when empty); an unknown name is an error naming the choices."""
    if not names:
        return entries
    known = {entry.name for entry in entries}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ManifestError(
            f"--models/MNEMO_MODELS names {printable(', '.join(unknown))}, which the manifest does not have; "
            f"its models: {', '.join(sorted(known))}"
        )
    return [entry for entry in entries if entry.name in names]
