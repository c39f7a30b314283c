"""The task families the service knows: one package each (the package is its `Task`), registered here."""

from __future__ import annotations

from app.runtime.model import Task
from app.tasks import knowledge_trace, similarity

TASKS: dict[str, Task] = {task.name: task for task in (similarity, knowledge_trace)}
