"""The reproducibility pipeline: artifacts and provenance, bench, smoke, report and audit."""
