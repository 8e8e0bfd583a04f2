"""Hypothesis strategies for protocol frames, built field by field from the protocol's pydantic models.

Every field of `InitFrame` / `UpdateFrame` / `Tail` gets a strategy that mixes valid values with
hostile ones (lone surrogates, controls, inner whitespace, huge integers, wrong types); a frame
may also drop fields, add unknown ones, or be raw text / bytes. `FIELD_STRATEGIES` must cover
every model field (tests/serve/test_fuzz_protocol.py checks it), so a new field is fuzzed too. Raw frames
include the expensive and oversized shapes a hostile client sent (`expensive_frame`).
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from alignatt.serve.protocol import InitFrame, Tail, UpdateFrame

# Any character, lone surrogates (category Cs) included.
any_char = st.characters(codec=None, exclude_categories=())
# What issue 10 found, and its relatives: lone surrogates, controls, bidi overrides, inner spaces.
nasty = st.sampled_from(["\ud800", "\udfff", "\ud83d", "\x00", "\x07", "\x1b[2J", "\x85", "\u202e", "\u2066",
                         "\u200b", "\ufeff", " ", "\t", "\n", "\u3000", "\U0001F600"])
hostile_text = st.one_of(
    st.text(any_char, max_size=12),
    nasty,
    st.tuples(st.text(max_size=4), nasty, st.text(max_size=4)).map("".join),
)
plain_word = st.sampled_from(["the", "causal", "encoder", "block.", "Haus", "ok", "x", "once."])
word_text = st.one_of(
    plain_word, plain_word, plain_word,
    hostile_text,
    st.sampled_from(["two words", " padded ", "tab\tin", "\u202eevil", "bell\x07", "\ud800", "", "   "]),
)
timestamp = st.one_of(st.none(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=3), st.booleans())
word_entry = st.one_of(
    st.tuples(word_text, st.none(), st.none()).map(list),
    st.tuples(word_text, timestamp, timestamp).map(list),
    word_text,
    st.lists(word_text, min_size=0, max_size=4),
    st.integers(),
)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False),
                        hostile_text)
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(hostile_text, inner, max_size=3), max_leaves=8)
counter = st.one_of(st.integers(0, 50), st.integers(0, 50), st.integers(-3, 2**60), st.just(2**53), json_scalar)

FIELD_STRATEGIES = {
    InitFrame: {
        "type": st.just("init"),
        "protocol_version": st.one_of(st.just(1), st.just(1), st.just(1), json_scalar),
        "source_lang": st.one_of(st.just("en"), st.just("en"), hostile_text),
        "target_lang": st.one_of(st.just("de"), st.just("de"), st.just("ja"), hostile_text),
        "preset": st.one_of(st.none(), st.sampled_from(["low_latency", "balanced", "quality", "nope"]), json_scalar),
        "overrides": st.one_of(
            st.just({}),
            st.dictionaries(st.one_of(st.sampled_from(["translation_alignatt_hold_back_target_units",
                                                       "translation_alignatt_min_emit_target_units"]), hostile_text),
                            st.one_of(st.integers(-2, 4), json_scalar), max_size=3),
        ),
        "context_text": st.one_of(st.just(""), hostile_text),
        "history": st.one_of(st.just([]), st.lists(st.tuples(hostile_text, hostile_text).map(list), max_size=3),
                             json_value),
        "accepted_target_prefix": st.one_of(st.just(""), st.just("Das"), hostile_text),
        "target_langs": st.one_of(st.none(), st.just(["de"]), st.lists(st.sampled_from(["de", "fr", "zh"]),
                                                                       min_size=1, max_size=3), json_value),
    },
    UpdateFrame: {
        "type": st.just("update"),
        "seq": counter,
        "utterance_id": st.one_of(st.none(), st.integers(0, 3), st.integers(0, 3), counter),
        "words": st.one_of(st.lists(word_entry, max_size=8), st.lists(plain_word.map(lambda w: [w, None, None]),
                                                                       max_size=12), json_value),
        "tail": st.one_of(st.none(), st.fixed_dictionaries({"words": st.lists(word_entry, max_size=4)}), json_value),
        "clock_ms": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False), json_scalar),
        "is_final": st.one_of(st.booleans(), st.booleans(), json_scalar),
    },
    Tail: {"words": st.lists(word_entry, max_size=4)},
}


@st.composite
def frame_dict(draw, model) -> dict:
    """A frame of `model`: each field present or absent, plus maybe unknown fields."""
    fields = FIELD_STRATEGIES[model]
    out = {"type": draw(fields["type"])}
    for name, strategy in fields.items():
        if name != "type" and draw(st.booleans() | st.just(True)):  # present 3 times in 4
            value = draw(strategy)
            if value is not None or draw(st.booleans()):
                out[name] = value
    if draw(st.integers(0, 9)) == 0:
        out.update(draw(st.dictionaries(hostile_text, json_value, max_size=2)))
    return out


def _dumps(frame: dict) -> str:
    return json.dumps(frame)  # ensure_ascii: lone surrogates travel as \\udXXX escapes, as an attacker sends them


raw_frame = st.one_of(
    st.text(any_char, max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=40),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b"{", b"[" * 3000 + b"]" * 3000, b'{"type": "update", "seq": ' + b"9" * 5000 + b"}",
                     b'{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de",'
                     b' "overrides": {"\\ud800": 1}}']),
)
# Issue 25's shapes: frames that cost the event loop (256 KiB of nested arrays, 87 000 values) and
# inits refused for their size (a 250 kB accepted_target_prefix), built once.
NESTED_ARRAYS = b'{"type": "update", "seq": 1, "x": [' + b",".join([b"[" * 600 + b"]" * 600] * 216) + b"]}"
MANY_VALUES = b"[" + b",".join([b"[]"] * 87_000) + b"]"
HUGE_PREFIX_INIT = (b'{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de", '
                    b'"accepted_target_prefix": "' + b"Wort " * 50_000 + b'"}')
expensive_frame = st.sampled_from([NESTED_ARRAYS, MANY_VALUES, HUGE_PREFIX_INIT,
                                   b'{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de",'
                                   b' "target_langs": ["de", "' + b"x" * 60_000 + b'"]}'])
raw_frame = st.one_of(raw_frame, expensive_frame)
init_frame = frame_dict(InitFrame).map(lambda f: _dumps(f).encode())
update_frame = frame_dict(UpdateFrame).map(lambda f: _dumps(f).encode())
any_frame = st.one_of(update_frame, update_frame, update_frame, init_frame, raw_frame)
