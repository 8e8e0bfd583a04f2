"""The MT server: WhisperLiveKit protocol v1, streaming sessions, and the pool of loaded seams."""
