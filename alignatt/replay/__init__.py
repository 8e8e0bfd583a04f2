"""The ASR stream and the clients that replay it against a server: native, real-time, WhisperLiveKit, speaker processes."""
