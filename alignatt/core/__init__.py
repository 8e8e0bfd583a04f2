"""The core: draft types and the Seam protocol, the AlignAtt policy, the prompt, per-layer attention geometry."""
