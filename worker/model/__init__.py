"""Model execution: the forward pass over the paged KV cache, its layers, quantization, loaders and the
sampler; the runner turns the engine's plan into tensors, and build.py wires a loaded model into an engine."""
