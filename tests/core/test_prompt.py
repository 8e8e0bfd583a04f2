"""Prompt building: chat / few-shot style, and the exact token positions of every source word."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alignatt.core.draft import DraftRequest
from alignatt.core.errors import AlignattError
from alignatt.models.presets import tiny_tokenizer
from alignatt.core.prompt import build_prompt, language_name, uncached_by_region

TOKENIZER = tiny_tokenizer()

words_strategy = st.lists(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), blacklist_characters="<>"),
        min_size=1, max_size=8,
    ).filter(lambda w: w.strip() == w and not any(c.isspace() for c in w)),
    min_size=1, max_size=12,
)


def check_source_spans(tokenizer, request, layout):
    words = request.source_words
    assert layout.source_token_positions == sorted(layout.source_token_positions)
    assert len(set(layout.source_token_positions)) == len(layout.source_token_positions)
    assert len(layout.source_token_positions) == len(layout.source_word_of_token)
    assert layout.source_word_of_token == sorted(layout.source_word_of_token)  # words in order
    for w, word in enumerate(words):
        positions = layout.word_token_positions(w)
        assert positions, f"word {w} {word!r} has no token"
        text = tokenizer.decode([layout.input_ids[p] for p in positions])
        assert text.strip() == word
    # nothing after the source region is claimed, and the prefix region is never source
    assert max(layout.source_token_positions) < layout.prefix_start <= len(layout.input_ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=words_strategy, prefix=st.sampled_from(["", "Der Anfang", "Ünïcode – ok"]))
def test_every_source_word_maps_to_its_own_tokens(words, prefix):
    request = DraftRequest(source_words=words, committed_words=len(words), target_prefix=prefix)
    layout = build_prompt(TOKENIZER, request)
    check_source_spans(TOKENIZER, request, layout)


@pytest.mark.parametrize("words", [["r"], ["user"], ["model"], ["turn"], ["Translate"], ["of", "turn"]])
def test_a_source_word_that_also_occurs_in_the_template_is_found_where_the_source_is(words):
    # The template itself holds "r", "user", "model", "turn", ...: the source is where the template
    # put it (found by 'r' in "<start_of_turn>" before).
    request = DraftRequest(source_words=words, committed_words=len(words))
    layout = build_prompt(TOKENIZER, request)
    check_source_spans(TOKENIZER, request, layout)
    user_turn = layout.text.index("<start_of_turn>user\n") + len("<start_of_turn>user\n")
    enc = TOKENIZER(layout.text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["offset_mapping"][layout.source_token_positions[0]][0] == user_turn


def test_chat_prompt_has_instruction_source_and_continued_prefix():
    request = DraftRequest(source_words="the cat sat".split(), committed_words=2, target_prefix="Die Katze")
    layout = build_prompt(TOKENIZER, request)
    assert layout.style == "chat" and not layout.stop_at_newline
    assert "Translate the following English text into German" in layout.text
    assert layout.text.endswith("<start_of_turn>model\nDie Katze")  # the assistant turn continues
    assert TOKENIZER.decode(layout.input_ids[layout.prefix_start:]) == "Die Katze"
    assert TOKENIZER.decode(layout.input_ids) == layout.text

    no_prefix = build_prompt(TOKENIZER, DraftRequest(source_words="the cat sat".split(), committed_words=2))
    assert no_prefix.prefix_start == len(no_prefix.input_ids)
    assert no_prefix.source_token_positions == layout.source_token_positions  # prefix comes after


def test_uncached_prompt_tokens_are_counted_by_region_up_to_a_grown_source():
    """Two updates of one session: a prefix cache serves the first prompt's tokens up to where the
    source grew; the rest is the new source, the turn's end with the generation prompt, the prefix."""
    before = build_prompt(TOKENIZER, DraftRequest(source_words="the cat sat".split(), committed_words=2,
                                                  target_prefix="Die Katze"))
    after = build_prompt(TOKENIZER, DraftRequest(source_words="the cat sat down".split(), committed_words=3,
                                                 target_prefix="Die Katze"))
    shared = next(i for i, (a, b) in enumerate(zip(before.input_ids, after.input_ids)) if a != b)
    got = uncached_by_region(after, shared)
    assert got["before the source"] == 0 and got["source"] >= 1
    end = after.source_token_positions[-1] + 1
    assert got["after the source"] == after.prefix_start - end
    assert TOKENIZER.decode(after.input_ids[end:after.prefix_start]).endswith("<start_of_turn>model\n")
    assert got["target prefix"] == len(after.input_ids) - after.prefix_start
    assert sum(got.values()) == len(after.input_ids) - shared
    assert sum(uncached_by_region(after, 0).values()) == len(after.input_ids)  # nothing served
    assert set(uncached_by_region(after, len(after.input_ids)).values()) == {0}  # all served


def test_prefix_trailing_whitespace_is_not_part_of_the_prompt():
    a = build_prompt(TOKENIZER, DraftRequest(source_words=["hi"], committed_words=1, target_prefix="Hallo "))
    b = build_prompt(TOKENIZER, DraftRequest(source_words=["hi"], committed_words=1, target_prefix="Hallo"))
    assert a.input_ids == b.input_ids


def test_bad_source_words_are_rejected():
    with pytest.raises(AlignattError, match="empty or contains whitespace"):
        build_prompt(TOKENIZER, DraftRequest(source_words=["a", "", "b"], committed_words=1))
    with pytest.raises(AlignattError, match="empty or contains whitespace"):
        build_prompt(TOKENIZER, DraftRequest(source_words=["a b"], committed_words=1))
    with pytest.raises(ValueError, match="empty source"):
        DraftRequest(source_words=[], committed_words=0)


def test_unknown_language_code_is_used_verbatim():
    request = DraftRequest(source_words=["x"], committed_words=1, source_lang="xx", target_lang="de")
    assert "Translate the following xx text into German" in build_prompt(TOKENIZER, request).text


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["", "Der Premierminister"])
def test_embedded_gemma3_few_shot_prompt_spans(gemma3_270m, prefix):
    tok = gemma3_270m.tokenizer
    words = "The Prime-Minister's résumé, 2,500 € — was well-known in 1999.".split()
    request = DraftRequest(source_words=words, committed_words=3, target_prefix=prefix)
    layout = build_prompt(tok, request)
    assert layout.style == "few_shot" and layout.stop_at_newline
    assert layout.input_ids[0] == tok.bos_token_id
    assert layout.text.endswith("German:" + (" " + prefix if prefix else ""))
    check_source_spans(tok, request, layout)
    if prefix:
        assert tok.decode(layout.input_ids[layout.prefix_start:]).strip() == prefix


@pytest.mark.slow
def test_embedded_tokenizer_is_subword_not_characters(gemma3_270m):
    """transformers' GGUF loader yields a character-level tokenizer; ours must be Gemma's BPE."""
    tok = gemma3_270m.tokenizer
    ids = tok("The house is small and the translation works.", add_special_tokens=False)["input_ids"]
    assert len(ids) <= 10
    assert tok.convert_ids_to_tokens(tok(" house", add_special_tokens=False)["input_ids"]) == ["▁house"]
    assert tok("<start_of_turn>", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids("<start_of_turn>")]


# ---- context and history (outside the source region) ----

CONTEXT = "Speaker: Mariella Vantoni. Terms: encoder = Kodierer."
HISTORY = [("We start now.", "Wir fangen jetzt an."), ("The house is small.", "Das Haus ist klein.")]


def check_blocks(tokenizer, request, layout):
    """Context and history tokens decode to their texts, in order, all before the source."""
    check_source_spans(tokenizer, request, layout)
    first_source = min(layout.source_token_positions)
    ctx, hist = layout.context_token_positions, layout.history_token_positions
    assert not set(ctx) & set(hist) and not set(ctx + hist) & set(layout.source_token_positions)
    if request.context_text:
        assert tokenizer.decode([layout.input_ids[p] for p in ctx]).strip() == request.context_text.strip()
    else:
        assert ctx == []
    assert all(p < first_source for p in ctx + hist)
    if request.history:
        assert max(ctx, default=-1) < min(hist)  # context first, then the earlier turns
        decoded = tokenizer.decode([layout.input_ids[p] for p in hist])
        for s, t in request.history:
            assert s in decoded and t in decoded
    else:
        assert hist == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=words_strategy, prefix=st.sampled_from(["", "Der Anfang"]),
       context=st.sampled_from(["", CONTEXT, "the cat sat"]), n_history=st.integers(0, 2))
def test_source_spans_stay_exact_with_context_and_history(words, prefix, context, n_history):
    request = DraftRequest(source_words=words, committed_words=len(words), target_prefix=prefix,
                           context_text=context, history=HISTORY[:n_history])
    layout = build_prompt(TOKENIZER, request)
    check_blocks(TOKENIZER, request, layout)
    bare = build_prompt(TOKENIZER, DraftRequest(source_words=words, committed_words=len(words),
                                                target_prefix=prefix))
    shift = len(layout.input_ids) - len(bare.input_ids)
    # The source tokens are the same tokens, only moved by the blocks in front of them.
    assert [p - shift for p in layout.source_token_positions] == bare.source_token_positions
    assert layout.input_ids[-len(bare.input_ids) + min(bare.source_token_positions):] == \
        bare.input_ids[min(bare.source_token_positions):]


def test_source_that_repeats_a_history_turn_is_the_last_occurrence():
    request = DraftRequest(source_words="The house is small.".split(), committed_words=2,
                           context_text="The house is small.", history=HISTORY)
    layout = build_prompt(TOKENIZER, request)
    check_blocks(TOKENIZER, request, layout)


def test_chat_prompt_puts_context_in_the_system_turn_and_history_as_turns():
    request = DraftRequest(source_words="the cat sat".split(), committed_words=3,
                           context_text=CONTEXT, history=HISTORY[:1])
    text = build_prompt(TOKENIZER, request).text
    assert text.index(CONTEXT) < text.index("We start now.") < text.index("Wir fangen jetzt an.") < text.index("the cat sat")
    assert text.count("<start_of_turn>model") == 2  # one earlier assistant turn, then the open one


def test_direction_aware_language_names():
    for src, tgt, names in (("en", "zh", ("English", "Chinese")), ("cs", "en", ("Czech", "English")),
                            ("en", "it", ("English", "Italian"))):
        text = build_prompt(TOKENIZER, DraftRequest(source_words=["x"], committed_words=1,
                                                    source_lang=src, target_lang=tgt)).text
        assert f"Translate the following {names[0]} text into {names[1]}" in text


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["en-de", "en-zh", "cs-en", "en-it"])
def test_embedded_few_shot_spans_with_context_and_history(gemma3_270m, direction):
    tok = gemma3_270m.tokenizer
    src, tgt = direction.split("-")
    words = "Das ist gut, sagte Herr Nováček.".split() if src == "cs" else "It's well-known, said Mr. Smith.".split()
    history = [("Dobrý den.", "Good morning.")] if src == "cs" else [("Good morning.", "早上好。" if tgt == "zh" else "Buongiorno.")]
    request = DraftRequest(source_words=words, committed_words=3, target_prefix="", source_lang=src,
                           target_lang=tgt, context_text=CONTEXT, history=history)
    layout = build_prompt(tok, request)
    assert layout.style == "few_shot"
    check_blocks(tok, request, layout)
    assert layout.text.endswith(f"\n{language_name(tgt)}:")


def test_a_preparer_travels_between_processes_and_bounds_the_engine_positions():
    """`PromptPreparer` is `prepare` as an object: pickled (tokenizer and all) it builds the same
    prompt, and a prompt plus its draft beyond the engine's positions is refused."""
    import pickle

    from alignatt.core.prompt import PromptPreparer

    request = DraftRequest(source_words="the cat sat".split(), committed_words=2, target_prefix="Die")
    built = build_prompt(TOKENIZER, request)
    travelled = pickle.loads(pickle.dumps(PromptPreparer(TOKENIZER, 4096)))
    assert travelled(request) == built
    exact = PromptPreparer(TOKENIZER, len(built.input_ids) + request.max_new_tokens)
    assert exact(request) == built
    with pytest.raises(AlignattError, match="exceeds max_model_len"):
        PromptPreparer(TOKENIZER, len(built.input_ids) + request.max_new_tokens - 1)(request)


# ---- the history window and the engine's prefix cache ----

TURNS = [(f"Sentence number {i} is here.", f"Satz Nummer {i} ist hier.") for i in range(8)]


@pytest.mark.parametrize("window,kept", [
    ("sliding", [1, 2, 3, 3, 3, 3, 3, 3]),
    ("chunked", [1, 2, 3, 4, 5, 3, 4, 5]),  # 2 x 3 - 1 = 5 at most, then back to the last 3
])
def test_the_history_window_keeps_the_newest_turns(window, kept):
    """What a session keeps after each closed utterance (`Session._remember`): the newest turns."""
    from alignatt.core.prompt import ContextConfig, recent_history

    config = ContextConfig(history_pairs=3, history_window=window)
    history: list = []
    for n, k in enumerate(kept):
        history = recent_history(history + [TURNS[n]], config)
        assert history == TURNS[n + 1 - k:n + 1], n
    assert recent_history(TURNS, ContextConfig(history_pairs=0, history_window=window)) == []


def test_a_chunked_history_keeps_the_earlier_prompt_as_the_next_ones_prefix():
    """A closed utterance joins the history. Sliding, the oldest turn goes, and the next prompt
    differs from the last one right after the instructions: its whole history is new to the
    prefix cache. Chunked, until a cut, the next prompt starts with the last one's history."""
    from alignatt.core.prompt import ContextConfig, recent_history

    def served(history, window):
        kept = recent_history(history, ContextConfig(history_pairs=3, history_window=window))
        return build_prompt(TOKENIZER, DraftRequest(source_words="and then more".split(), committed_words=3,
                                                    history=kept))

    for window in ("sliding", "chunked"):
        before, after = served(TURNS[:3], window), served(TURNS[:4], window)
        shared = next(i for i, (x, y) in enumerate(zip(before.input_ids, after.input_ids)) if x != y)
        new_history = [p for p in after.history_token_positions if p >= shared]
        if window == "chunked":  # the three earlier turns are served; only the fourth is new
            assert shared > max(before.history_token_positions)
            assert len(new_history) < len(after.history_token_positions) / 3
        else:
            assert len(new_history) > 0.8 * len(after.history_token_positions)  # all but a shared opening
