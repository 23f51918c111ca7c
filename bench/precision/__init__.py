"""Precisions of a vLLM-CPU engine: the bf16-eager reproduction and each precision's numerics and speed on this CPU."""
