"""Capture seams: the registry that builds any seam by name, and the transformers and vLLM implementations."""
