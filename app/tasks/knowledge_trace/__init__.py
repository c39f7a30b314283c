"""The knowledge-tracing task (DKVMN and the DKT baseline), its attributes the `Task` protocol's; its /students
routes are app/transports/students.py."""

from __future__ import annotations

from app.tasks.knowledge_trace import rest, service
from app.tasks.knowledge_trace import tensors as tensors  # its Open Inference Protocol codec

name = service.TASK_NAME
tag = "knowledge tracing"
endpoints = rest.ENDPOINTS
routes = rest.routes
graphs = ()
prepare, describe = service.prepare, service.describe
