"""The artifact record: the artifact schema, provenance, and the child-process runner."""
