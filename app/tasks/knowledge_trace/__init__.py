"""The knowledge-tracing task (DKVMN and the DKT baseline): service, schemas, the stateless HTTP adapter and the
/students endpoints."""

from __future__ import annotations

from types import MappingProxyType

from fastapi import APIRouter

from app.tasks.knowledge_trace import http, service, students

routes = APIRouter()
routes.include_router(http.router)
routes.include_router(students.router)


class KnowledgeTraceTask:
    name = http.TASK_NAME
    router = routes
    sequence_inputs = ("q", "r")
    sequence_outputs = MappingProxyType({"p": 0, "corr_w": 0, "mastery": 1})
    prepare = staticmethod(service.prepare)
    describe = staticmethod(service.describe)


TASK = KnowledgeTraceTask()
