"""The vLLM seam: engine start, the in-graph query cache and its hooks, and the fetch that rebuilds rows."""
