"""Models: one preset table (family, ids, default heads, vLLM support), loading, the embedded model, synthetic init."""
