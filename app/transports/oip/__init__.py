"""The Open Inference Protocol (KServe v2 REST) beside the task API: `router`, included by app/main.py.

tensors.py: the protocol's request body and tensor (de)coding; knowledge_trace.py and similarity.py:
one adapter per task over its service (declared tensors, `prepare` on a worker thread, `infer`
through the batcher); routes.py: the endpoints and the `{"error": ...}` responses.
"""

from app.transports.oip.routes import router

__all__ = ["router"]
