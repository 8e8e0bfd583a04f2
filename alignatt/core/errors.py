"""The one exception type that the CLI turns into a single clear error line (exit 2)."""


class AlignattError(Exception):
    """A user-facing error: bad input, unknown model or preset, a missing model package..."""
