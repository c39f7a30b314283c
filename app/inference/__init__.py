"""Numpy-side inference: tokenizer, word vectors, and the pre/post-processing around each ONNX graph."""
