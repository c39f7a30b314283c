"""The Open Inference Protocol over gRPC (`inference.GRPCInferenceService`, Triton's and KServe's v2 service).

A second transport over the same task services as REST: servicer.py answers each method with what
app/transports/oip/inference.py gives REST v2 (the task's tensor codec, admission, deadline, statistics);
wire.py turns the protobuf messages (tritonclient's generated stubs) into the protocol's request and back;
server.py runs the server in the app's lifespan on MNEMO_GRPC_PORT.
"""

from app.transports.grpc.server import serve_grpc

__all__ = ["serve_grpc"]
