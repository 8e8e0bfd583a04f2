"""Real speech in: packaged clips, recognised live (WhisperLiveKit's LocalAgreement over faster-whisper), as timed streams."""
