"""Correctness tooling: seam parity on any device and the GPU checks of the vLLM seam, with typed messages."""
