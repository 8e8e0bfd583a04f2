"""The transformers seams: one greedy draft loop, eager attention rows, and rows rebuilt from q and k."""
