"""One router per area: operations, similarity, knowledge tracing."""
