"""Protocol v1 frames: the one parser, its error messages, overrides, and what goes on the wire."""

import json

import pytest

from alignatt.serve.protocol import (
    BAD_PROTOCOL,
    ErrorFrame,
    InitFrame,
    InitOk,
    ProtocolError,
    TranslationFrame,
    UpdateFrame,
    override_policy_fields,
    parse_frame,
)

LIMIT = 10_000


def parse(obj):
    return parse_frame(json.dumps(obj), LIMIT)


def test_init_as_the_whisperlivekit_client_sends_it():
    f = parse({"type": "init", "protocol_version": 1, "source_lang": "EN", "target_lang": "de",
               "overrides": {"translation_alignatt_hold_back_target_units": 1},
               "history": [["Hello.", "Hallo."]], "accepted_target_prefix": "Wir"})
    assert isinstance(f, InitFrame) and f.direction == "en-de"
    assert f.history == [("Hello.", "Hallo.")] and f.accepted_target_prefix == "Wir"
    assert f.preset is None and f.unknown_fields() == []


def test_update_words_and_tail():
    f = parse({"type": "update", "seq": 3, "utterance_id": 1,
               "words": [["The", 0.0, 400.0], ["causal", 400, None]],
               "tail": {"words": [["encoder", None, None]]}, "clock_ms": 800.0, "is_final": False})
    assert isinstance(f, UpdateFrame)
    assert f.words == ["The", "causal"] and f.tail_words == ["encoder"] and not f.is_final
    bare = parse({"type": "update", "seq": 4, "words": ["a", ["b"]]})
    assert bare.words == ["a", "b"] and bare.tail_words == [] and bare.utterance_id is None  # the open utterance


@pytest.mark.parametrize(
    "raw, fragment, seq",
    [
        (b"\xff", "not valid UTF-8", None),
        ("{", "invalid JSON", None),
        ("null", "JSON object", None),
        ('{"type": "hello"}', "unknown frame type 'hello'", None),
        ('{"type": "init", "protocol_version": 2}', "protocol_version 2 is not supported", None),
        ('{"type": "init", "protocol_version": 1, "source_lang": "en"}', "target_lang", None),
        ('{"type": "init", "protocol_version": 1, "source_lang": "", "target_lang": "de"}', "source_lang", None),
        ('{"type": "update", "seq": 1.5}', "seq", None),
        ('{"type": "update", "seq": true}', "seq", None),
        ('{"type": "update", "seq": 2, "words": "a b"}', "words", 2),
        ('{"type": "update", "seq": 2, "words": [["a", 1, 2, 3]]}', "a word must be", 2),
        ('{"type": "update", "seq": 2, "words": [["a", true, 2]]}', "timestamps", 2),
        ('{"type": "update", "seq": 2, "tail": {"words": [[7]]}}', "tail", 2),
        ('{"type": "update", "seq": 2, "clock_ms": "now"}', "clock_ms", 2),
    ],
)
def test_bad_frames_say_what_is_wrong(raw, fragment, seq):
    with pytest.raises(ProtocolError) as e:
        parse_frame(raw, LIMIT)
    assert e.value.code == BAD_PROTOCOL and fragment in e.value.message and e.value.seq == seq


def test_frame_size_limit_counts_bytes():
    text = json.dumps({"type": "update", "seq": 1, "words": ["ü" * 3000]})  # 6000+ bytes, 3000+ chars
    with pytest.raises(ProtocolError, match="exceeds the 5000-byte limit"):
        parse_frame(text, 5000)


def test_unknown_fields_are_kept_for_reporting():
    f = parse({"type": "update", "seq": 1, "confidence": 1, "tail": {"words": [], "stable": True}})
    assert f.unknown_fields() == ["confidence", "tail.stable"]


def test_overrides_map_to_policy_fields_and_unknown_keys_come_back():
    fields, unknown = override_policy_fields({
        "translation_alignatt_hold_back_target_units": 0,
        "translation_alignatt_min_emit_target_units": 2,
        "translation_alignatt_beam": 4,
    })
    assert fields == {"hold_back_words": 0, "min_emit_words": 2}
    assert unknown == ["translation_alignatt_beam"]
    for bad in (-1, 1.5, "1", True, None):
        with pytest.raises(ProtocolError, match="non-negative integer"):
            override_policy_fields({"translation_alignatt_hold_back_target_units": bad})


def test_outgoing_frames():
    t = json.loads(TranslationFrame(seq=1, utterance_id=0, final=False, committed_text="Die",
                                    committed_delta="Die", buffer_text=" Katze",
                                    covered_source_units=1).to_json())
    assert t["type"] == "translation" and "ignored_fields" not in t and t["forced_final"] is False
    assert t["stop_reason"] is None  # part of the translation frame even when there is none
    e = json.loads(ProtocolError(BAD_PROTOCOL, "nope", seq=3, supported=[1]).frame().to_json())
    assert e == {"type": "error", "code": "bad_protocol", "message": "nope", "seq": 3, "supported": [1]}
    assert "seq" not in json.loads(ErrorFrame(code="busy", message="full").to_json())
    ok = json.loads(InitOk(direction="en-de", preset="balanced", model="m").to_json())
    assert ok["type"] == "init_ok" and ok["protocol_version"] == 1


# ---- hostile input that used to escape the parser (issue 10) ----


def test_an_integer_past_pythons_digit_limit_is_bad_protocol_not_a_crash():
    raw = '{"type": "update", "seq": 1, "clock_ms": ' + "9" * 5000 + "}"
    with pytest.raises(ProtocolError) as e:
        parse_frame(raw, 100_000)
    assert e.value.code == BAD_PROTOCOL and "invalid JSON" in e.value.message


@pytest.mark.parametrize(
    "raw, where",
    [
        ('{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de", '
         '"overrides": {"\\ud800x": 1}}', "frame.overrides key"),
        ('{"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de", '
         '"accepted_target_prefix": "Das \\udfff"}', "frame.accepted_target_prefix"),
        ('{"type": "update", "seq": 3, "words": [["a\\ud83d", null, null]]}', "frame.words[0][0]"),
    ],
)
def test_lone_surrogates_are_refused_where_they_are(raw, where):
    with pytest.raises(ProtocolError) as e:
        parse_frame(raw, LIMIT)
    assert e.value.code == BAD_PROTOCOL and where in e.value.message and "surrogate" in e.value.message
    e.value.frame().to_json().encode("utf-8")  # the error itself is sendable


def test_a_valid_surrogate_pair_is_text():
    f = parse_frame('{"type": "update", "seq": 1, "words": [["\\ud83d\\ude00", null, null]]}', LIMIT)
    assert f.words == ["\U0001F600"]


@pytest.mark.parametrize("word", ["a b", "a\tb", "new\nline", "x\u3000y"])
def test_words_with_inner_whitespace_are_bad_protocol(word):
    with pytest.raises(ProtocolError) as e:
        parse({"type": "update", "seq": 5, "words": [[word, None, None]]})
    assert e.value.code == BAD_PROTOCOL and "whitespace" in e.value.message and e.value.seq == 5
    with pytest.raises(ProtocolError):
        parse({"type": "update", "seq": 5, "tail": {"words": [word]}})
    assert parse({"type": "update", "seq": 5, "words": [" padded "]}).words == [" padded "]


def test_counters_past_the_safe_integer_range_are_refused():
    with pytest.raises(ProtocolError) as e:
        parse({"type": "update", "seq": 2**53})
    assert "seq" in e.value.message and e.value.seq is None
    with pytest.raises(ProtocolError):
        parse({"type": "update", "seq": 1, "utterance_id": 2**60})


def test_outgoing_frames_always_serialise():
    text = ErrorFrame(code=BAD_PROTOCOL, message="bad \ud800 key").to_json()
    text.encode("utf-8")
    assert json.loads(text)["message"] == "bad \ud800 key"


# ---- what a frame may cost, and what an error may echo (issue 25) ----


def nested_arrays_frame(items: int = 216, depth: int = 600) -> str:
    """The stall reproduction: a 256 KiB update of deeply nested empty arrays (valid JSON)."""
    return '{"type": "update", "seq": 1, "x": [' + ",".join(["[" * depth + "]" * depth] * items) + "]}"


@pytest.mark.parametrize("raw", [
    nested_arrays_frame(),
    "[" + ",".join(["[]"] * 87_000) + "]",
    '{"type": "update", "seq": 1, "x": [' + ",".join(["1"] * 120_000) + "]}",
])
def test_a_frame_of_many_json_values_is_refused_before_it_is_parsed(raw, monkeypatch):
    import alignatt.serve.protocol as protocol

    def never(*args, **kwargs):
        raise AssertionError("the frame was parsed or walked")

    monkeypatch.setattr(protocol.json, "loads", never)
    with pytest.raises(ProtocolError) as e:
        parse_frame(raw, 256 * 1024)
    assert e.value.code == BAD_PROTOCOL and f"the limit is {protocol.MAX_FRAME_VALUES}" in e.value.message


def test_frames_without_escapes_skip_the_surrogate_walk(monkeypatch):
    import alignatt.serve.protocol as protocol

    def never(*args, **kwargs):
        raise AssertionError("walked a frame that cannot hold a lone surrogate")

    monkeypatch.setattr(protocol, "_lone_surrogate", never)
    words = [[f"w{i}ü", None, None] for i in range(400)]
    frame = {"type": "update", "seq": 1, "words": words}
    raw = json.dumps(frame, ensure_ascii=False)  # as UTF-8 text: no escape, so no surrogate possible
    assert len(parse_frame(raw, 100_000).words) == 400


def test_a_legitimate_large_frame_is_parsed():
    history = [[f"source {i}. " * 40, f"Ziel {i}. " * 40] for i in range(12)]
    init = parse_frame(json.dumps({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de",
                                   "history": history, "context_text": "Glossar [a], {b}, " * 100}), 256 * 1024)
    assert len(init.history) == 12
    words = [[f"w{i}", i * 10.0, i * 10.0 + 5] for i in range(400)]
    update = {"type": "update", "seq": 1, "words": words, "tail": {"words": words[:64]}}
    assert len(parse_frame(json.dumps(update), 256 * 1024).words) == 400


def test_error_messages_never_echo_a_huge_input():
    huge = "x" * 240_000
    for raw in ('{"type": "' + huge + '"}', '{"type": "init", "protocol_version": "' + huge + '"}'):
        with pytest.raises(ProtocolError) as e:
            parse_frame(raw, 10**6)
        assert len(e.value.frame().to_json()) < 1000
    assert len(ProtocolError(BAD_PROTOCOL, huge).message) <= 500
    assert len(json.loads(ErrorFrame(code="busy", message=huge).to_json())["message"]) <= 500
    with pytest.raises(ProtocolError) as e:  # target_langs entries are language codes, bounded as target_lang
        parse_frame(json.dumps({"type": "init", "protocol_version": 1, "source_lang": "en", "target_lang": "de",
                                "target_langs": ["de", huge]}), 10**6)
    assert "target_langs" in e.value.message and len(e.value.message) < 500
