"""The measurements: bench, server smoke, capacity, capture cost and soak."""
