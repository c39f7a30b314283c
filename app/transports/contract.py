"""The OpenAPI contract beyond the routes' own models: response bodies, the errors each operation can answer (ours
`{"detail": ...}`, the protocol's `{"error": ...}` under /v2), and the Bearer scheme when API keys are on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.json_schema import models_json_schema

from app.transports.access import ApiKeys
from app.transports.error_handlers import is_protocol_path

STATEFUL_OPERATIONS = frozenset({"append_interactions", "get_student"})
STORE_OPERATIONS = STATEFUL_OPERATIONS | {"delete_student", "list_students"}  # 429: too many store calls waiting

ProtocolErrorBody = create_model(
    "ProtocolErrorBody",
    __doc__="Every error of the protocol's own endpoints (400 bad tensors, 404, 429, 503, 504).",
    error=(str, Field(description="one sentence saying what went wrong")),
)
ErrorBody = create_model(
    "ErrorBody", detail=(str, Field(description="one sentence saying what went wrong and what to do"))
)
ValidationErrorItem = create_model(
    "ValidationErrorItem",
    loc=(list[str | int], Field(description="where: body, query, path or header, then the field names and indexes")),
    msg=(str, Field(description="the rule that was broken")),
    type=str,
)
ValidationErrorBody = create_model(
    "ValidationErrorBody",
    detail=(list[ValidationErrorItem], Field(description="the first 20 errors")),
    error_count=(int | None, Field(None, description="how many errors there were in all")),
)
Health = create_model("Health", status=(str, Field(description="ok")))
Readiness = create_model(
    "Readiness",
    status=(str, Field(description="ready")),
    models=(int, Field(ge=0, description="number of models served")),
)


class Batching(BaseModel):
    max_batch: int
    max_wait_ms: float
    max_queue: int
    max_cells: int | None = Field(None, description="padded rows x length per run on a CPU instance; null: no limit")


class InstanceInfo(BaseModel):
    """One session of a model (MNEMO_PROVIDER lists one per instance) and the cost its runs have shown."""

    name: str = Field(description="its provider's short name and its place in MNEMO_PROVIDER, e.g. cpu-1")
    provider: str = Field(description="the execution provider the session really uses")
    max_rows: int | None = Field(description="rows per run this instance takes at most; null: the model's max_batch")
    cost: dict[str, float] = Field(description="the learned cost of a run: fixed_ms + per_step_us + per_cell_us")


class ModelInfo(BaseModel):
    """One model of the manifest; the task adds its own fields (similarity: max_tokens, entailment_labels,
    embedding_dim, max_sentences, encoder, paraphrase_labels; knowledge tracing: family, supports, n_questions,
    n_concepts, seqlen)."""

    model_config = ConfigDict(extra="allow")

    name: str
    task: str = Field(description="similarity or knowledge-trace")
    version: str
    sha256: str = Field(description="of the ONNX file, checked at startup")
    provider: str | None = Field(description="the execution provider the session really uses")
    default: bool
    ready: bool
    limits: dict[str, int | float]
    metrics: dict[str, float | int | None] = Field(description="test-split metrics from the model card")
    metadata: dict[str, Any]
    card: str | None = None
    batching: Batching | None = None
    instances: list[InstanceInfo] = Field(default_factory=list, description="a session per MNEMO_PROVIDER entry")
    error: str | None = Field(None, description="why the model is not ready")
    max_tokens: int | None = None
    entailment_labels: list[str] | None = None
    family: str | None = Field(None, description="knowledge tracing: dkvmn (memory slots) or dkt (an LSTM)")
    supports: dict[str, bool] | None = Field(
        None, description="knowledge tracing: which optional fields it fills (mastery, attention, concepts)"
    )
    embedding_dim: int | None = Field(None, description="size of the sentence vectors of POST /embeddings")
    max_sentences: int | None = Field(None, description="sentences per POST /embeddings request")
    encoder: str | None = Field(None, description="the `encoder` of POST /embeddings answers; changes with the weights")
    paraphrase_labels: list[str] | None = Field(
        None, description="similarity: the labels of `paraphrase` in its answers; only a model with a paraphrase head"
    )
    n_questions: int | None = None
    n_concepts: int | None = Field(None, description="knowledge tracing: latent concepts; null for DKT")
    seqlen: int | None = None


ModelList = create_model("ModelList", models=list[ModelInfo])

CONTRACT_MODELS = (ErrorBody, ValidationErrorBody, Health, Readiness, ModelInfo, ModelList, ProtocolErrorBody)
DESCRIPTIONS = {
    "400": "A malformed request: HTTP framing the parser refuses, or a header that must appear once (Authorization, "
    "Content-Type, Content-Encoding, X-Request-ID, ...) sent twice; on /v2 also tensors the model does not take "
    "(name, datatype, shape or values; the message names the input), a parameter it refuses (named) or an "
    "output requested twice",
    "401": "No API key, or an unknown one (only when MNEMO_API_KEYS is set)",
    "404": "Unknown model; the message lists the models that exist",
    "408": "The request body stalled (MNEMO_BODY_TIMEOUT_S) or was not complete by the request's deadline "
    "(MNEMO_REQUEST_TIMEOUT_S)",
    "409": "The stored state belongs to another version of the model (delete the student and replay), a lost race, "
    "or (an append) a stored count other than its expected_interactions",
    "413": "Request body over MNEMO_MAX_BODY_BYTES",
    "415": "Content-Type is not application/json (task endpoints), the body is compressed (Content-Encoding), or it is "
    "not UTF-8 (a declared charset, a byte order mark, UTF-16/32)",
    "422": "Invalid input; each error names the field and the rule",
    "429": "A queue is full (the model's, the server's, or the student store's calls); retry after Retry-After seconds",
    "503": "Not ready: models loading, the model not loaded, the server draining or out of connections; on /students "
    "also the student state store unavailable",
    "504": "The request did not complete within MNEMO_REQUEST_TIMEOUT_S",
}


def _errors(operation: dict[str, Any], protocol: bool, protected: bool) -> dict[str, str]:
    """The error statuses an operation can answer, each with its body's schema (/v2 reads its input itself: no 422)."""
    operation_id, parameters = operation.get("operationId"), operation.get("parameters", [])
    has_body, in_path = "requestBody" in operation, any(parameter.get("in") == "path" for parameter in parameters)
    when = {"401": protected, "404": has_body or in_path, "408": has_body, "409": operation_id in STATEFUL_OPERATIONS}
    when |= {"415": has_body, "422": not protocol and (has_body or parameters), "504": has_body}
    when["429"] = has_body or operation_id in STORE_OPERATIONS
    statuses = {"400", "413", "503", *(status for status, applies in when.items() if applies)}
    body = "ProtocolErrorBody" if protocol else "ErrorBody"
    errors = {status: "ValidationErrorBody" if status == "422" else body for status in statuses}
    if operation_id == "oip_ready":
        errors["503"] = "ServerReadiness"  # {"ready": false}; the drain gate lets this path through
    return errors


def document_contract(schema: dict[str, Any], keys: ApiKeys, bodies: Iterable[type[BaseModel]]) -> dict[str, Any]:
    """The schema with the `bodies` routes read themselves, each operation's errors and, with API keys, Bearer auth."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    models = [(model, "validation") for model in (*bodies, *CONTRACT_MODELS)]
    components.update(models_json_schema(models, ref_template="#/components/schemas/{model}")[1]["$defs"])
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    for path, operations in schema["paths"].items():
        protocol, protected = is_protocol_path(path), keys.protects(path)
        for operation in operations.values():
            if protocol:  # FastAPI documents a 422 for any path parameter; a plain str cannot fail
                operation["responses"].pop("422", None)
            if protected:
                operation["security"] = [{"bearerAuth": []}]
            for status, name in sorted(_errors(operation, protocol, protected).items()):
                content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}
                operation["responses"][status] = {"description": DESCRIPTIONS[status], "content": content}
    bearer = {"type": "http", "scheme": "bearer", "description": "one of MNEMO_API_KEYS"}
    if keys.keys:
        schema["components"]["securitySchemes"] = {"bearerAuth": bearer}
    return schema
