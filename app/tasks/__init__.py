"""The task families the service knows: one package each, registered here with one line."""

from __future__ import annotations

from app.runtime.model import Task
from app.tasks.knowledge_trace import TASK as KNOWLEDGE_TRACE
from app.tasks.similarity import TASK as SIMILARITY

TASKS: dict[str, Task] = {task.name: task for task in (SIMILARITY, KNOWLEDGE_TRACE)}
