"""The source side of the session property tests: committed words, tail and utterance id, moved
by the ops hypothesis draws (arrive, commit, rewrite, a new utterance, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SourceOps:
    committed: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    uid: int = 0
    counter: int = 0  # numbers new words, so every word is distinct

    def apply(self, op: str, n: int) -> bool:
        """Move the source by one op; True when the op asks for a final. An op the source does not
        know (`fail`: the engine's) leaves it as it is."""
        if op == "arrive":
            self.tail += [f"w{self.counter + i}" for i in range(n)]
            self.counter += n
        elif op == "commit":
            self.committed, self.tail = self.committed + self.tail[:n], self.tail[n:]
        elif op == "commit_all":
            self.committed, self.tail = self.committed + self.tail, []
        elif op == "final":
            return True
        elif op == "rewrite" and self.committed:
            self.committed = self.committed[:-1] + [f"x{self.counter}"]
            self.counter += 1
        elif op == "skip":
            self.new_utterance(self.uid + n)
        elif op == "skip_with_words":  # the next utterance's first update already has words
            self.new_utterance(self.uid + n)
            self.committed, self.tail = [f"n{self.counter}"], [f"t{self.counter}"]
            self.counter += 1
        elif op == "drop_tail":
            self.tail = []
        return False

    def new_utterance(self, uid: int) -> None:
        self.uid, self.committed, self.tail = uid, [], []
