"""The similarity task (LSTM_RMC on SICK): service, schemas, and its JSON and tensor codecs."""

from __future__ import annotations

from types import MappingProxyType

from fastapi import APIRouter

from app.runtime.model import GraphLayout
from app.tasks.similarity import rest, service, tensors


class SimilarityTask:
    name = service.TASK_NAME
    tag = "similarity"
    endpoints = rest.ENDPOINTS
    routes = APIRouter()
    tensors = tensors
    sequence_inputs = ("emb_a", "emb_b")
    sequence_outputs = MappingProxyType({"attn_a_fwd": 0, "attn_a_bwd": 0, "attn_b_fwd": 0, "attn_b_bwd": 0})
    graphs = MappingProxyType({"encoder": GraphLayout(sequence_inputs=("emb",)), "head": GraphLayout()})
    prepare = staticmethod(service.prepare)
    describe = staticmethod(service.describe)


TASK = SimilarityTask()
