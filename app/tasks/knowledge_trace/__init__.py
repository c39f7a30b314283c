"""The knowledge-tracing task (DKVMN): service, schemas and HTTP adapter."""

from __future__ import annotations

from types import MappingProxyType

from app.tasks.knowledge_trace import http, service


class KnowledgeTraceTask:
    name = http.TASK_NAME
    router = http.router
    sequence_inputs = ("q", "r")
    sequence_outputs = MappingProxyType({"p": 0, "corr_w": 0, "mastery": 1})
    prepare = staticmethod(service.prepare)
    describe = staticmethod(service.describe)


TASK = KnowledgeTraceTask()
