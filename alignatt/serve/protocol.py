"""WhisperLiveKit's `alignatt` protocol v1: every frame as a pydantic model, one parse function.

JSON text frames, one connection = one session (client: `whisperlivekit/translation_alignatt.py`,
whisperlivekit 0.2.26):

    client → server   init      {protocol_version: 1, source_lang, target_lang, preset?, overrides?,
                                 context_text?, history? [[source, target], ...],
                                 accepted_target_prefix?}
    server → client   init_ok   {protocol_version, direction, preset, model, ...}
    client → server   update    {seq, utterance_id, words: [[word, start_ms, end_ms], ...],
                                 tail?: {words: [[word, null, null], ...]}, clock_ms, is_final}
    server → client   translation {seq, utterance_id, final, forced_final, committed_text,
                                 committed_delta, buffer_text, covered_source_units, stop_reason}
    server → client   error     {code, message, seq?, supported?}

Opt-in extension (docs/server.md): `init.target_langs: [...]` translates into several targets;
`init_ok.targets` lists them and every `translation` frame then carries `target_lang`. Without
it neither field appears.

`parse_frame` is the one place that validates input; everything it rejects becomes a
`ProtocolError` with a code and a message the client can show. Unknown fields are tolerated and
reported back (`ignored_fields`), never silently dropped. A string holding a lone UTF-16
surrogate (a JSON `\ud800` escape) is refused anywhere in a frame: it cannot be encoded as UTF-8,
so nothing derived from it could ever be sent back. Outgoing frames always serialise (`to_json`).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

PROTOCOL_VERSION = 1
# seq and utterance_id stay integers every client can hold (JavaScript's safe range).
MAX_COUNTER = 2**53 - 1

# Error codes on the wire.
BAD_PROTOCOL = "bad_protocol"
UNSUPPORTED_DIRECTION = "unsupported_direction"
UNKNOWN_PRESET = "unknown_preset"
BUSY = "busy"
PROCESSING_FAILED = "processing_failed"

# An error message quotes the input it refuses, cut to this (an error frame never echoes a huge input).
MAX_MESSAGE_CHARS = 500
# The JSON values (containers, scalars) one frame may hold. A protocol frame holds a few per word
# (updates have at most a few hundred words) and per history turn; this bounds what parsing a frame
# can cost the event loop whatever its nesting (a 256 KiB frame of empty arrays holds 87 000).
MAX_FRAME_VALUES = 8192


def cut(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message` at most `limit` characters, an ellipsis marking a cut."""
    return message if len(message) <= limit else message[: limit - 1] + "…"

# The per-session overrides the WhisperLiveKit client sends (its latency presets), and the policy
# field each one sets.
OVERRIDE_FIELDS = {
    "translation_alignatt_hold_back_target_units": "hold_back_words",
    "translation_alignatt_min_emit_target_units": "min_emit_words",
}


class ProtocolError(Exception):
    """Input the server refuses; becomes an `error` frame (the connection stays usable)."""

    def __init__(self, code: str, message: str, seq: int | None = None, **extra: Any) -> None:
        message = cut(message)
        super().__init__(message)
        self.code = code
        self.message = message
        self.seq = seq
        self.extra = extra

    def frame(self) -> "ErrorFrame":
        return ErrorFrame(code=self.code, message=self.message, seq=self.seq, **self.extra)


class FrameTooLarge(ProtocolError):
    """A frame past the byte bound (before init the connection closes after its error frame)."""


class _Incoming(BaseModel):
    # Unknown fields are kept in `model_extra` so they can be reported back.
    model_config = ConfigDict(extra="allow")

    def unknown_fields(self, prefix: str = "") -> list[str]:
        return sorted(prefix + k for k in (self.model_extra or {}))


def _word_text(entry: Any) -> str:
    """A word entry is `[word, start_ms|null, end_ms|null]` (shorter lists and bare strings too)."""
    if isinstance(entry, str):
        return _one_word(entry)
    if isinstance(entry, (list, tuple)) and 1 <= len(entry) <= 3 and isinstance(entry[0], str):
        for t in entry[1:]:
            if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))):
                raise ValueError(f"word timestamps must be numbers or null, got {t!r}"[:200])
        return _one_word(entry[0])
    raise ValueError(f"a word must be [word, start_ms, end_ms], got {entry!r}"[:200])


def _one_word(word: str) -> str:
    """A word may carry leading/trailing spaces (ASR tokens do) but no whitespace inside."""
    if any(c.isspace() for c in word.strip()):
        raise ValueError(f"a word must not contain whitespace, got {word!r}"[:200])
    return word


class InitFrame(_Incoming):
    type: Literal["init"]
    protocol_version: StrictInt
    source_lang: StrictStr = Field(min_length=1, max_length=32)
    target_lang: StrictStr = Field(min_length=1, max_length=32)
    preset: StrictStr | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    context_text: StrictStr = ""
    history: list[tuple[StrictStr, StrictStr]] = Field(default_factory=list)
    accepted_target_prefix: StrictStr = ""
    # Opt-in extension: translate into several targets; every translation frame names its target.
    target_langs: list[Annotated[StrictStr, Field(min_length=1, max_length=32)]] | None = Field(
        None, min_length=1, max_length=16)

    @property
    def direction(self) -> str:
        return f"{self.source_lang.strip().lower()}-{self.target_lang.strip().lower()}"

    @property
    def targets(self) -> list[str]:
        """The target languages (one unless `target_langs` is given), lower-case, in order."""
        if self.target_langs is None:
            return [self.target_lang.strip().lower()]
        return list(dict.fromkeys(t.strip().lower() for t in self.target_langs))


class Tail(_Incoming):
    words: list[Any] = Field(default_factory=list)

    @field_validator("words")
    @classmethod
    def _words(cls, v: list[Any]) -> list[str]:
        return [_word_text(e) for e in v]


class UpdateFrame(_Incoming):
    type: Literal["update"]
    seq: StrictInt = Field(ge=0, le=MAX_COUNTER)
    # Missing: the open utterance (the first one is 0; after a final, the next one).
    utterance_id: StrictInt | None = Field(None, ge=0, le=MAX_COUNTER)
    words: list[Any] = Field(default_factory=list)
    tail: Tail | None = None
    clock_ms: float | None = None
    is_final: StrictBool = False

    @field_validator("words")
    @classmethod
    def _words(cls, v: list[Any]) -> list[str]:
        return [_word_text(e) for e in v]

    @property
    def tail_words(self) -> list[str]:
        return list(self.tail.words) if self.tail else []

    def unknown_fields(self, prefix: str = "") -> list[str]:
        tail = self.tail.unknown_fields("tail.") if self.tail else []
        return super().unknown_fields(prefix) + tail


class _Outgoing(BaseModel):
    model_config = ConfigDict(extra="allow")
    _optional: ClassVar[frozenset[str]] = frozenset()  # left out of the frame when None

    def to_json(self) -> str:
        exclude = {k for k in self._optional if getattr(self, k) is None}
        try:
            return self.model_dump_json(exclude=exclude)
        except ValueError:  # text that UTF-8 cannot hold: escape it (ASCII JSON) instead of failing
            return json.dumps(self.model_dump(mode="python", exclude=exclude), ensure_ascii=True, default=str)


class InitOk(_Outgoing):
    type: Literal["init_ok"] = "init_ok"
    protocol_version: int = PROTOCOL_VERSION
    direction: str
    preset: str
    model: str
    seam: str = ""
    heads: list[tuple[int, int]] = Field(default_factory=list)
    policy: dict[str, Any] = Field(default_factory=dict)
    unknown_overrides: list[str] = Field(default_factory=list)
    ignored_fields: list[str] = Field(default_factory=list)
    # The effective configuration: what the preset and overrides resolved to, and what was kept
    # of the client's context and history.
    source_lang: str = ""
    target_lang: str = ""
    head_set: str = ""
    session: dict[str, Any] = Field(default_factory=dict)
    context_chars: int = 0
    history_received: int = 0
    history_used: int = 0
    history_trimmed: int = 0
    targets: list[dict[str, Any]] | None = None  # only for `target_langs` sessions
    _optional: ClassVar[frozenset[str]] = frozenset({"targets"})


class TranslationFrame(_Outgoing):
    type: Literal["translation"] = "translation"
    seq: int
    utterance_id: int
    final: bool
    forced_final: bool = False
    committed_text: str
    committed_delta: str
    buffer_text: str
    covered_source_units: int
    stop_reason: str | None = None
    # Not in the client's contract (it ignores them); they make latency and the fast path visible.
    path: str = ""
    target_lang: str | None = None  # only in `target_langs` sessions
    engine_calls: int = 0
    compute_ms: float = 0.0  # inside the session (drafting included)
    server_ms: float = 0.0  # frame received -> reply sent (queueing included)
    ignored_fields: list[str] | None = None
    _optional: ClassVar[frozenset[str]] = frozenset({"ignored_fields", "target_lang"})


class ErrorFrame(_Outgoing):
    type: Literal["error"] = "error"
    code: str
    message: str
    seq: int | None = None
    supported: list[Any] | None = None
    _optional: ClassVar[frozenset[str]] = frozenset({"seq", "supported"})

    @field_validator("message")
    @classmethod
    def _cut(cls, message: str) -> str:
        return cut(message)


def _best_effort_seq(data: Any) -> int | None:
    seq = data.get("seq") if isinstance(data, dict) else None
    if isinstance(seq, int) and not isinstance(seq, bool) and 0 <= seq <= MAX_COUNTER:
        return seq
    return None


def _lone_surrogate(data: Any, budget: int = MAX_FRAME_VALUES) -> str | None:
    """Where the first string holding a lone surrogate is (a key or a value), or None; past `budget`
    nodes the walk stops and names the frame (the walk only locates what `_holds_surrogate` found)."""
    stack: list[tuple[str, Any]] = [("frame", data)]
    while stack and budget > 0:  # iterative: json.loads already bounded the depth, this walk never recurses
        budget -= 1
        path, node = stack.pop()
        if isinstance(node, str):
            if not node.isascii() and _has_surrogate(node):
                return path
        elif isinstance(node, dict):
            for k, v in node.items():
                if not k.isascii() and _has_surrogate(k):
                    return f"{path} key"
                stack.append((f"{path}.{k}"[:80], v))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(node))
    return "frame" if stack else None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _holds_surrogate(text: str, data: Any) -> bool:
    """Whether any string of the parsed frame holds a lone surrogate. Decoded UTF-8 holds none, so
    only a `\\u` escape can make one; a frame with such escapes is re-encoded once, in C."""
    if "\\u" not in text:
        return False
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):  # a nesting the encoder refuses: the walk decides
        return True
    return False


# A JSON string (escapes included); what is left outside strings is the frame's structure.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')


def _json_values(text: str) -> int:
    """At most how many values `text` holds: its commas and opening brackets outside strings, plus one."""
    structure = _JSON_STRING.sub("", text)
    return structure.count(",") + structure.count("[") + structure.count("{") + 1


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:3]:
        loc = ".".join(str(x) for x in e["loc"] if not str(x).startswith(("function-", "tagged")))
        parts.append(f"{loc or 'frame'}: {e['msg']}")
    more = f" (+{err.error_count() - 3} more)" if err.error_count() > 3 else ""
    return "; ".join(parts) + more


def parse_frame(raw: bytes | str, max_bytes: int) -> InitFrame | UpdateFrame:
    """Validate one incoming frame; raise `ProtocolError(bad_protocol, ...)` on anything wrong.

    Its cost is linear in the frame and small: the byte bound, then the count of JSON values (a
    regular expression and counts, in C) before `json.loads`, and the lone-surrogate check only
    for frames with `\\u` escapes."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > max_bytes:
        raise FrameTooLarge(BAD_PROTOCOL, f"frame of {len(raw)} bytes exceeds the {max_bytes}-byte limit")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(
            BAD_PROTOCOL, f"frame is not valid UTF-8 ({e.reason} at byte {e.start}); send JSON text"
        ) from None
    values = _json_values(text)
    if values > MAX_FRAME_VALUES:
        raise ProtocolError(BAD_PROTOCOL, f"frame holds up to {values} JSON values; the limit is {MAX_FRAME_VALUES}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # ValueError: also ints past Python's digit limit
        raise ProtocolError(BAD_PROTOCOL, f"invalid JSON: {e}"[:300]) from None
    seq = _best_effort_seq(data)
    where = _lone_surrogate(data) if _holds_surrogate(text, data) else None
    if where is not None:
        raise ProtocolError(
            BAD_PROTOCOL, f"{where}: a lone UTF-16 surrogate is not text; send valid Unicode"[:300], seq=seq
        )
    if not isinstance(data, dict):
        raise ProtocolError(BAD_PROTOCOL, "a frame must be a JSON object")
    kind = data.get("type")
    if kind not in ("init", "update"):
        raise ProtocolError(
            BAD_PROTOCOL, f"unknown frame type {kind!r}; expected 'init' or 'update'"[:300], seq=seq
        )
    if kind == "init" and data.get("protocol_version") != PROTOCOL_VERSION:
        raise ProtocolError(
            BAD_PROTOCOL,
            f"protocol_version {data.get('protocol_version')!r} is not supported"[:300],
            supported=[PROTOCOL_VERSION],
        )
    try:
        return (InitFrame if kind == "init" else UpdateFrame).model_validate(data)
    except ValidationError as e:
        raise ProtocolError(BAD_PROTOCOL, f"bad {kind} frame: {_describe(e)}"[:500], seq=seq) from None


def override_policy_fields(overrides: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    """Map the client's override keys to policy fields; unknown keys are returned, not dropped."""
    fields: dict[str, int] = {}
    unknown: list[str] = []
    for key, value in overrides.items():
        name = OVERRIDE_FIELDS.get(key)
        if name is None:
            unknown.append(key)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ProtocolError(BAD_PROTOCOL, f"override {key} must be a non-negative integer, got {value!r}")
        fields[name] = value
    return fields, sorted(unknown)
