"""Whole talks of a test split, and its sources cleaned of the CSV quoting they were exported with.

The en→de, en→it and en→zh pairs are sentences of ACL talks; their `pair_id`s follow the talks'
order (the alignment files store them locally shuffled). The sources were exported from a CSV
file whose cell held one whole talk, so two traces of that export are in the raw text:
- a talk whose text needed quoting opens with a lone `"` (its first sentence) and closes with a
  lone `"` (its last sentence);
- every quote inside such a talk is doubled (`""`).

Talk boundaries (`talk_starts`), read on the pairs sorted by id: a talk starts at the first pair,
at a pair that opens with a lone quote, right after a pair that closes with a lone quote, and at a
greeting (`Hi`, `Hello` opening the sentence) right after a sentence that thanks the audience (for
talks whose cell was not quoted). A second speaker of one talk ("Hello, I am Omar and now I will
talk about ...", after "So let's now see ...") is no boundary. A talk's name is its first pair
id in the whole alignment file (`acl-0`, `acl-30`, ...); the rule applied to the en→de, en→it and
en→zh files gives the same 21 talks (en→zh lacks the one sentence that marks `acl-162`, so the
union of the three is used). cs→en pairs are single Europarl sentences from unrelated speeches:
they have no talks.

Normalisation (`normalise_source`): `""` becomes `"`, and the lone quote that opens or closes a
talk's cell is removed. A quote left unpaired in a sentence after that is a quotation spanning
two sentences (a paper title), kept as spoken. The references carry no CSV traces.
"""

from __future__ import annotations

import re
from typing import Iterable

LONE_OPEN = re.compile(r'^"(?!")')
LONE_CLOSE = re.compile(r'(?<!")"$')
GREETING = re.compile(r"^(Hi|Hello)\b")
THANKS = re.compile(r"\bthank", re.IGNORECASE)


def opens_cell(source: str) -> bool:
    return bool(LONE_OPEN.search(source.strip()))


def closes_cell(source: str) -> bool:
    s = source.strip()
    return bool(LONE_CLOSE.search(s)) and not (len(s) == 1)


def talk_starts(sources: Iterable[tuple[int, str]]) -> list[int]:
    """The ids that start a talk, from raw (id, source) pairs in any order (see the module doc)."""
    starts, prev = [], None
    for pid, source in sorted(sources):
        s = source.strip()
        if (prev is None or opens_cell(s) or closes_cell(prev)
                or (GREETING.search(s) and THANKS.search(prev))):
            starts.append(pid)
        prev = s
    return starts


def talk_of(pid: int, starts: list[int]) -> str:
    """The talk a pair id belongs to: `acl-<the last start at or before it>`."""
    first = max((s for s in starts if s <= pid), default=None)
    if first is None:
        raise ValueError(f"pair id {pid} comes before the first talk start {min(starts)}")
    return f"acl-{first}"


def normalise_source(raw: str, cells: bool = True) -> str:
    """The source as spoken: CSV-doubled quotes undone and, in a set exported one talk a cell
    (`cells`), a talk cell's own quotes removed (cs→en has no cells: its lone quotes are quotes)."""
    s = raw.strip()
    if cells and opens_cell(s):
        s = s[1:]
    if cells and closes_cell(s):
        s = s[:-1]
    return " ".join(s.replace('""', '"').split())


def pair_number(pair_id: str) -> int:
    """`en-de:213` -> 213 (the alignment file's pair id)."""
    return int(pair_id.rsplit(":", 1)[-1])


def whole_talks(pairs, count: int | None = None) -> list[list]:
    """The test pairs (`TestPair`s with a `talk`) as whole talks: each talk's pairs in id order,
    talks in the order of their first id; the first `count` talks (None: all). Pairs without a talk
    (cs→en) make none."""
    talks: dict[str, list] = {}
    for p in sorted((p for p in pairs if p.talk), key=lambda p: pair_number(p.id)):
        talks.setdefault(p.talk, []).append(p)
    out = list(talks.values())
    return out[:count] if count is not None else out
