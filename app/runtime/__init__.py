"""The runtime: the shared run slots (thread budget) and a micro-batcher per model."""
