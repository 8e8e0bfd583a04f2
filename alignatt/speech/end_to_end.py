"""What the user's path end to end did, read off the relay's frames and WhisperLiveKit's messages.

The frames between WhisperLiveKit's alignatt client and `alignatt serve` (`wlk_server.Relay`) are
turned into the replay events the smoke's caption delay reads (`captions.caption_delays`): each
reply, with the update it answers (its committed words and tail), sent at the update's frame time
and answered one relay round trip later, on the audio's clock (seconds since the feed began x
speed). Each committed word's end in the audio is WhisperLiveKit's own timestamp, carried in its
update as `[word, start_ms, end_ms]`; the words are counted utterance by utterance in the order
their final replies came, as `captions.word_times` counts them.

"Committed text only grows" is counted three ways: an update whose committed words do not extend
the last update of its utterance (the source WhisperLiveKit sent), a shown message whose committed
transcript does not extend the one before (what a viewer read), and a reply whose committed
translation does not extend the last one of its utterance (`replay.events.count_retractions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from alignatt.record.events import ReplayEvent
from alignatt.replay.events import count_retractions
from alignatt.speech.captions import caption_delays, word_times
from alignatt.speech.wlk_server import Frame

CLIENT = "wlk-server"  # the events' client: WhisperLiveKit's own server, through the relay


def _words(update: dict) -> list[list]:
    """An update's committed words as [text, start_ms, end_ms], the malformed left out."""
    return [w for w in update.get("words") or [] if isinstance(w, (list, tuple)) and w and isinstance(w[0], str)]


def _tail_words(update: dict) -> int:
    tail = update.get("tail") or {}
    return len(tail.get("words") or []) if isinstance(tail, dict) else 0


@dataclass
class EndToEnd:
    events: list[ReplayEvent]  # one per MT reply (translation or error) to an update fed after the start
    words: list[tuple[str, float, float | None]]  # every committed word: text, end (s), first covered (s)
    updates: int = 0
    errors: list[str] = field(default_factory=list)  # every error frame's code
    rtt_ms: list[float] = field(default_factory=list)
    source_retractions: int = 0
    transcript_retractions: int = 0
    translation_retractions: int = 0
    delays_s: list[float] = field(default_factory=list)  # per covered word
    never_covered: int = 0
    shown_translations: int = 0  # lines with a translation in WhisperLiveKit's last message

    @property
    def replies(self) -> list[ReplayEvent]:
        return [e for e in self.events if not e.error]

    @property
    def replies_with_committed_text(self) -> int:
        return sum(1 for e in self.replies if (e.committed_text or "").strip())

    @property
    def finals(self) -> int:
        return sum(1 for e in self.replies if e.final)


def _end_s(word: list, before: float) -> float:
    """A word's end in the audio (s): its end, else its start, else the word before's."""
    for ms in (word[2] if len(word) > 2 else None, word[1] if len(word) > 1 else None):
        if isinstance(ms, (int, float)):
            return round(ms / 1000.0, 3)
    return before


def reply_events(frames: list[Frame], began_s: float, speed: float) -> tuple[list[ReplayEvent], int, list[str]]:
    """Each reply to an update sent once the feed began (relay time `began_s`), as a replay event on the
    audio's clock; the updates sent, and every error frame's code."""
    sent: dict[tuple[int, int], Frame] = {}
    events, errors, updates = [], [], 0
    for f in frames:
        kind = f.data.get("type")
        if f.direction == "up" and kind == "update" and f.t >= began_s:
            sent[(f.connection, f.data.get("seq"))] = f
            updates += 1
        elif f.direction == "down" and kind == "error":
            errors.append(str(f.data.get("code")))
        if f.direction != "down" or kind not in ("translation", "error"):
            continue
        up = sent.get((f.connection, f.data.get("seq")))
        if up is None:
            continue  # an init's error, or a reply to an update before the feed (none is expected)
        update = up.data
        events.append(ReplayEvent(
            client=CLIENT, seq=update.get("seq"), connection=f.connection, is_final=bool(update.get("is_final")),
            stream_s=round((up.t - began_s) * speed, 3), lag_s=0.0, rtt_ms=round((f.t - up.t) * 1000.0, 1),
            committed_words=len(_words(update)), tail_words=_tail_words(update),
        ).answered(f.data))
    return events, updates, errors


def committed_words(frames: list[Frame], events: list[ReplayEvent]) -> list[tuple[str, float]]:
    """Every word WhisperLiveKit committed, with its end in the audio, in the order `word_times`
    counts them: utterance by utterance as their final replies came, then the utterances never closed."""
    last: dict[tuple[int, int | None], list[list]] = {}  # (connection, utterance) -> its latest words
    for f in frames:
        if f.direction == "up" and f.data.get("type") == "update":
            last[(f.connection, f.data.get("utterance_id"))] = _words(f.data)
    closed = [(e.connection or 0, e.utterance_id) for e in events if e.final and not e.error]
    order = list(dict.fromkeys(closed + [k for k in last if k not in closed]))
    out: list[tuple[str, float]] = []
    for key in order:
        for w in last.get(key, []):
            out.append((w[0], _end_s(w, out[-1][1] if out else 0.0)))
    return out


def source_retractions(frames: list[Frame]) -> int:
    """Updates whose committed words do not extend the previous update's of the same utterance."""
    before: dict[tuple[int, int | None], list[str]] = {}
    count = 0
    for f in frames:
        if f.direction != "up" or f.data.get("type") != "update":
            continue
        key = (f.connection, f.data.get("utterance_id"))
        words = [w[0] for w in _words(f.data)]
        if words[:len(before.get(key, []))] != before.get(key, []):
            count += 1
        before[key] = words
    return count


def shown_transcripts(shown: list[dict]) -> list[str]:
    """WhisperLiveKit's committed transcript (its lines' text) in each message that carries lines."""
    return ["".join(line.get("text") or "" for line in m["lines"]) for m in shown if isinstance(m.get("lines"), list)]


def transcript_retractions(shown: list[dict]) -> int:
    texts = shown_transcripts(shown)
    return sum(1 for a, b in zip(texts, texts[1:]) if not b.startswith(a))


def shown_translations(shown: list[dict]) -> int:
    """Lines with a translation in WhisperLiveKit's last message that carries lines."""
    last = next((m for m in reversed(shown) if isinstance(m.get("lines"), list)), {"lines": []})
    return sum(1 for line in last["lines"] if (line.get("translation") or "").strip())


def measure(frames: list[Frame], shown: list[dict], began_s: float, speed: float) -> EndToEnd:
    """The end-to-end run read off its frames (relay clock; the feed began at `began_s`) and
    WhisperLiveKit's shown messages."""
    events, updates, errors = reply_events(frames, began_s, speed)
    words = committed_words(frames, events)
    ends = [end for _, end in words]
    delays, never = caption_delays(events, ends, speed)
    _, covered_at = word_times(events, speed)
    return EndToEnd(
        events=events, updates=updates, errors=errors,
        words=[(w, end, None if j not in covered_at else round(covered_at[j], 3)) for j, (w, end) in enumerate(words)],
        rtt_ms=[e.rtt_ms for e in events if e.rtt_ms is not None],
        source_retractions=source_retractions([f for f in frames if f.t >= began_s]),
        transcript_retractions=transcript_retractions(shown),
        translation_retractions=count_retractions(events),
        delays_s=delays, never_covered=never, shown_translations=shown_translations(shown))
