"""alignatt: simultaneous MT with a decoder-only LLM, steered by alignment-head attention."""

__version__ = "0.1.0"
