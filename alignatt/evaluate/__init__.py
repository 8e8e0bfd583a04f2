"""`alignatt eval`: replay test sets through the server's Session and score quality and simultaneous latency."""
