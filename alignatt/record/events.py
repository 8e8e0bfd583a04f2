"""One replayed update as a record: what a replay client sent and what the reply said.

Events of different clients carry different fields (the lockstep client times a round trip, the
WhisperLiveKit run merges the server's step record, a disconnect is an event of its own); every
field is optional, and an event is written with exactly the fields it was given, so the smoke
artifact's per-update trace keeps its free-form shape on disk.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer

# The fields of a `translation` reply a replay client records.
REPLY_FIELDS = ("utterance_id", "final", "forced_final", "path", "engine_calls", "server_ms", "compute_ms",
                "committed_text", "committed_delta", "buffer_text", "stop_reason", "covered_source_units")


class ReplayEvent(BaseModel):
    model_config = ConfigDict(extra="allow")  # the server's step record adds its own fields

    client: str | None = None  # native | realtime | wlk
    event: str | None = None  # a client event that is no reply: disconnect | unsent_finals
    seq: int | None = None
    trigger: str | None = None  # arrive | commit
    stream_s: float | None = None
    lag_s: float | None = None
    committed_words: int | None = None
    tail_words: int | None = None
    is_final: bool | None = None
    rtt_ms: float | None = None
    # from the reply
    utterance_id: int | None = None
    final: bool | None = None
    forced_final: bool | None = None
    path: str | None = None
    engine_calls: int | None = None
    server_ms: float | None = None
    compute_ms: float | None = None
    committed_text: str | None = None
    committed_delta: str | None = None
    buffer_text: str | None = None
    stop_reason: str | None = None
    covered_source_units: int | None = None
    error: str | None = None  # an error reply's code
    message: str | None = None
    connection: int | None = None  # the server connection (a reconnected client opens another)

    @property
    def is_reply(self) -> bool:
        return self.event is None

    def answered(self, reply: dict[str, Any]) -> "ReplayEvent":
        """This event with the reply's fields: a translation's, or an error's code and message."""
        if reply.get("type") == "translation":
            fields = {k: reply.get(k) for k in REPLY_FIELDS}
        else:
            fields = {"error": reply.get("code"), "message": reply.get("message")}
        return ReplayEvent(**{**self.record(), **fields})

    def record(self) -> dict[str, Any]:
        """The event as the artifact stores it: the fields it was given, in that shape."""
        return self.model_dump()

    @model_serializer(mode="wrap")
    def _given_fields_only(self, handler: Any) -> dict[str, Any]:
        given = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in handler(self).items() if k in given}
