"""The similarity task (LSTM_RMC on SICK): service, schemas and HTTP adapter."""

from __future__ import annotations

from types import MappingProxyType

from app.runtime.model import GraphLayout
from app.tasks.similarity import http, service


class SimilarityTask:
    name = http.TASK_NAME
    router = http.router
    sequence_inputs = ("emb_a", "emb_b")
    sequence_outputs = MappingProxyType({"attn_a_fwd": 0, "attn_a_bwd": 0, "attn_b_fwd": 0, "attn_b_bwd": 0})
    graphs = MappingProxyType({"encoder": GraphLayout(sequence_inputs=("emb",)), "head": GraphLayout()})
    prepare = staticmethod(service.prepare)
    describe = staticmethod(service.describe)


TASK = SimilarityTask()
