"""The knowledge-tracing task (DKVMN and the DKT baseline); its /students routes are app/transports/students.py."""

from __future__ import annotations

from types import MappingProxyType

from app.tasks.knowledge_trace import rest, service, tensors


class KnowledgeTraceTask:
    name = service.TASK_NAME
    tag = "knowledge tracing"
    endpoints = rest.ENDPOINTS
    routes = rest.routes
    tensors = tensors
    sequence_inputs = ("q", "r")
    sequence_outputs = MappingProxyType({"p": 0, "corr_w": 0, "mastery": 1})
    prepare = staticmethod(service.prepare)
    describe = staticmethod(service.describe)


TASK = KnowledgeTraceTask()
