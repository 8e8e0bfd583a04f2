"""The `wlk` eval driver: each stream through `alignatt serve` by WhisperLiveKit's own client, unmodified.

`AlignAttTranslationClient` (whisperlivekit 0.2.26, `alignatt.replay.wlk_client`) is fed what
WhisperLiveKit's translation loop feeds it: each newly committed word as an `ASRToken`, then a
`HypothesisTail` snapshot of the unstable words, then `process()`. What `process()` returns is what
WhisperLiveKit shows: a validated segment when an utterance closes, else the append-only accepted
text as the buffer. That shown text is the reply's committed text, so the emissions are scored on
exactly what the client displays. WhisperLiveKit shows no held draft: `buffer_text` stays empty.

The client decides, as in WhisperLiveKit:
- the session's init: `preset` (the row's), `latency="balanced"` (it sends the tail and adds no
  policy overrides, so the preset alone sets the policy, as with the other drivers), no context;
  history and `accepted_target_prefix` only on a reconnect, which the eval treats as a failure;
- where an utterance closes: at a committed word with sentence punctuation (also inside a
  sentence, unlike the other drivers); a stream that ends without one is closed by
  `validate_buffer_and_reset()`, WhisperLiveKit's silence boundary.

What the client does not expose is measured at the driver boundary: the round trip is the wall
time of `process()` (the session is opened in `open()`, outside it); path, engine calls, compute
time, `final` and the utterance id come from the loopback server's step record of the update the
client sent.

Lockstep: for a real-time loop the client sends a tail-only update at most every
max(0.5 s, 1.2 x its last call). The driver waits that interval out before a tail-only update
(reading the client's timing, changing nothing), so every ASR event reaches the server as with the
other drivers; the wait is idle wall time, in no round trip.
"""

from __future__ import annotations

import importlib
import time

from alignatt.core.errors import AlignattError
from alignatt.evaluate.replay import Reply
from alignatt.replay.wlk_client import load_wlk_client
from alignatt.core.policy import DEFAULT_PRESET

CLIENT_LATENCY = DEFAULT_PRESET  # the client's latency preset that sends the tail and adds no policy overrides


class WlkDriver:
    name = "wlk"

    def __init__(self, server, preset: str, source_lang: str = "en", target_lang: str = "de",
                 words_per_second: float = 2.4) -> None:
        """`server`: the eval's loopback `ServerThread` (its step records are read per update)."""
        self.wlk = load_wlk_client()
        self.timed = importlib.import_module("whisperlivekit.timed_objects")
        self.server = server
        self.engine = self.wlk.AlignAttRemoteEngine(url=server.url, source_language=source_lang, preset=preset,
                                                    latency=CLIENT_LATENCY)
        self.target_lang = target_lang
        self.seconds_per_word = 1.0 / words_per_second
        self.client = None
        self.connection = 0
        self.last_seq = 0  # the newest seq whose step record was read
        self.in_utterance = 0  # committed words of the open utterance the client has
        self.in_stream = 0  # committed words of the whole stream the client has

    def open(self) -> None:
        self.client = self.engine.new_session(self.target_lang)
        self.client.process()  # nothing to send yet: this only opens the session (init, init_ok)
        if self.client._ws is None:
            raise AlignattError(f"the WhisperLiveKit client could not open a session at {self.server.url} "
                                "(its warning is in the log)")
        # The eval's server is private to it, and the client has just been accepted: the newest
        # connection is this one.
        self.connection = self.server.call(lambda: self.server.server.stats.connections)
        self.last_seq = self.in_utterance = self.in_stream = 0

    def update(self, committed, tail, is_final, utterance_id) -> Reply:
        client = self.client
        new = [self._token(w) for w in committed[self.in_utterance:]]
        self.in_utterance = len(committed)
        ends = (self.in_stream + len(tail)) * self.seconds_per_word  # the last arrived word's end
        client.insert_tokens([*new, self.timed.HypothesisTail(start=None, end=ends, text=" ".join(tail))])
        if is_final and not (new and new[-1].has_punctuation()):
            client.validate_buffer_and_reset()  # no closing punctuation: the end of speech closes it
        if not new and not is_final:
            self._wait_out_pacing()
        started = time.perf_counter()
        segment, buffer = client.process()
        rtt = (time.perf_counter() - started) * 1000.0
        step = self._answered()
        if step["final"]:
            self.in_utterance = 0
        shown = segment.text if segment is not None else buffer.text
        return Reply(step["utterance_id"], step["final"], (shown or "").strip(), "", step["path"],
                     step["engine_calls"], step["compute_ms"], rtt)

    def close(self) -> None:
        # The client has no close of its own (WhisperLiveKit drops it with the session).
        if self.client is not None and self.client._ws is not None:
            self.client._ws.close()
        self.client = None

    def _token(self, word: str):
        start = self.in_stream * self.seconds_per_word
        self.in_stream += 1
        return self.timed.ASRToken(start=start, end=start + self.seconds_per_word, text=" " + word)

    def _wait_out_pacing(self) -> None:
        client = self.client
        interval = max(self.wlk._MIN_PARTIAL_INTERVAL_SECONDS, self.wlk._PACING * client._last_call_duration)
        wait = client._last_call_started + interval - time.monotonic()
        if wait > 0:
            time.sleep(wait + 0.001)

    def _answered(self) -> dict:
        """The server's step record of the one update `process()` sent (newest records first)."""
        conn, last = self.connection, self.last_seq

        def newer():
            log, found = self.server.server.step_log, []
            for i in range(len(log) - 1, -1, -1):
                s = log[i]
                if s["connection"] != conn or s["seq"] <= last:
                    break
                found.append(s)
            return found[::-1]

        steps = self.server.call(newer)
        if self.client._ws is None:
            raise AlignattError(f"the WhisperLiveKit client dropped its session after seq {last} (a reply slower "
                                f"than its {self.wlk._CALL_TIMEOUT_SECONDS:g} s call timeout, or an error; "
                                "its warning is in the log)")
        if len(steps) != 1:
            raise AlignattError(f"the WhisperLiveKit client's process() after seq {last} got {len(steps)} "
                                "translations, not 1 (a dropped update is in the log)")
        self.last_seq = steps[0]["seq"]
        return steps[0]
