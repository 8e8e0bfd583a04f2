"""A deterministic fake seam for session/server tests: word-by-word "translation", known alignments.

Source word i translates to one target word ("W<i>:<word>", a leading space except at the very
start); token j of a draft attends to the source word it translates, shifted by `look_ahead`
(so a token can be made to look at the word after its own). The draft continues the target prefix:
it starts at source word `len(prefix.split())` and ends with EOS after the last source word, or
stops at `max_new_tokens`. `leak` appends a sentence that is not in the source (like a model that
keeps going), to exercise the final's bound. Prompt tokens are counted without a tokenizer: one
per 4 characters of each word (at least one), plus 5 for the template (`count_prompt_tokens`).
"""

from __future__ import annotations

import threading
import time

from alignatt.core.draft import Draft, DraftRequest, Head
from tests.support.drafts import peaked_token


def word_tokens(word: str) -> int:
    return max((len(word) + 3) // 4, 1)


def target_word(i: int, word: str) -> str:
    return f"W{i}:{word}"


class FakeSeam:
    name = "fake"

    def __init__(
        self,
        heads: list[Head] | None = None,
        look_ahead: int = 0,
        delay_s: float = 0.0,
        leak: str = "",
        fail_when=None,
        slow_when=None,
        max_positions: int = 4096,
    ) -> None:
        self.heads = heads or [Head(0, 0), Head(0, 1)]
        self.look_ahead = look_ahead
        self.delay_s = delay_s
        self.leak = leak
        self.fail_when = fail_when  # callable(request) -> bool: raise on that draft
        self.slow_when = slow_when  # callable(request) -> seconds of extra delay for that draft
        self.max_positions = max_positions  # what the server derives its token bounds from
        self.calls = 0
        self.requests: list[DraftRequest] = []
        self.threads: set[str] = set()
        self.closed_on: str | None = None  # the thread that closed this seam
        self._lock = threading.Lock()

    def count_text_tokens(self, text: str) -> int:
        return sum(word_tokens(w) for w in text.split())

    def count_prompt_tokens(self, request: DraftRequest) -> int:
        return 5 + sum(word_tokens(w) for w in request.source_words) + self.count_text_tokens(request.target_prefix)

    def close(self) -> None:
        self.closed_on = threading.current_thread().name

    def draft(self, request: DraftRequest) -> Draft:
        with self._lock:
            self.calls += 1
            self.requests.append(request)
            self.threads.add(threading.current_thread().name)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.slow_when is not None:
            time.sleep(self.slow_when(request))
        if self.fail_when is not None and self.fail_when(request):
            raise RuntimeError("fake engine failure")
        words = request.source_words
        n = len(words)
        start = len(request.target_prefix.split())
        pieces: list[tuple[str, int]] = []
        for i in range(start, n):
            text = target_word(i, words[i])
            pieces.append(((" " if (i > 0 or request.target_prefix) else "") + text, i))
        if self.leak:
            pieces += [(" " + w, n - 1) for w in self.leak.split()]
        stop = "eos"
        if len(pieces) > request.max_new_tokens:
            pieces, stop = pieces[: request.max_new_tokens], "max_new_tokens"
        n_heads = len(self.heads)
        tokens = [peaked_token(1000 + j, piece, n_heads, n, min(w + self.look_ahead, n - 1), 0.2, 0.6, 0.1, 0.1)
                  for j, (piece, w) in enumerate(pieces)]
        return Draft(
            request=request,
            heads=list(self.heads),
            prompt_token_count=5 + n,
            source_token_positions=list(range(5, 5 + n)),
            source_word_of_token=list(range(n)),
            tokens=tokens,
            stop_reason=stop,
            seam=self.name,
        )
