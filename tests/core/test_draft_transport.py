"""A `Draft` crosses from an engine process to the server pickled: each per-token array kind is
stacked over the draft on the way, and every token comes back with its own values."""

import io
import pickle

import numpy as np

from alignatt.core.draft import Draft, DraftRequest, Head, TokenCapture


def _draft(tokens):
    request = DraftRequest(source_words=["a", "b", "c"], committed_words=2)
    return Draft(request, [Head(0, 1), Head(2, 3)], 12, [4, 5, 6], [0, 1, 2], tokens, "eos")


def _token(j, rng, context=True, n_src=3):
    f = lambda *shape: rng.random(shape, dtype=np.float32)  # noqa: E731
    return TokenCapture(j, f" t{j}", f(2, n_src), f(2), f(2), f(2) if context else None, None)


def test_a_pickled_draft_brings_back_every_tokens_own_rows_and_masses():
    rng = np.random.default_rng(0)
    for tokens in ([_token(j, rng) for j in range(5)],  # stacked
                   [_token(0, rng), _token(1, rng, context=False)],  # a kind some tokens lack: one by one
                   [_token(0, rng, n_src=3), _token(1, rng, n_src=4)],  # shapes differ: one by one
                   []):
        draft = _draft(tokens)
        back = pickle.loads(pickle.dumps(draft))
        assert back.text == draft.text and back.request == draft.request and back.stop_reason == "eos"
        assert [t.token_id for t in back.tokens] == [t.token_id for t in tokens]
        for got, want in zip(back.tokens, tokens):
            for name in ("rows", "other_prompt_mass", "generated_mass", "context_mass", "history_mass"):
                a, b = getattr(got, name), getattr(want, name)
                assert (a is None) == (b is None), name
                if b is not None:
                    assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b), name


def test_a_stacked_draft_pickles_its_arrays_once_per_kind():
    """Five tokens, three array kinds: three arrays in the stream, not fifteen."""
    rng = np.random.default_rng(1)
    tokens = [TokenCapture(j, "x", *(rng.random(s, dtype=np.float32) for s in ((2, 3), (2,), (2,))))
              for j in range(5)]
    arrays = []

    class Counting(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, np.ndarray):
                arrays.append(obj.shape)
            return NotImplemented

    Counting(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(_draft(tokens))
    assert sorted(arrays) == [(5, 2), (5, 2), (5, 2, 3)]


def test_what_a_draft_derives_from_its_tokens_is_computed_once_and_never_outlives_them():
    """The server judges a draft several times per update: its stacked arrays and judgements are kept
    on it, never pickled, and a draft with other tokens (`replace`, a settled cut) derives its own."""
    from dataclasses import replace

    rng = np.random.default_rng(2)
    draft = _draft([_token(j, rng) for j in range(4)])
    rows = draft.stacked()[0]
    assert draft.stacked()[0] is rows and rows.shape == (4, 2, 3)
    calls = []
    assert draft.memo("k", lambda: calls.append(1) or 7) == 7 and draft.memo("k", lambda: calls.append(1)) == 7
    assert calls == [1]
    cut = replace(draft, tokens=draft.tokens[:2])
    assert cut.stacked()[0].shape == (2, 2, 3) and cut.memo("k", lambda: 8) == 8
    back = pickle.loads(pickle.dumps(draft))
    assert back.memo("k", lambda: 9) == 9  # judgements stay behind; the stacked arrays travel as they are
    assert np.array_equal(back.stacked()[0], rows) and np.array_equal(back.block_mass("context"),
                                                                      draft.block_mass("context"))
    assert back.tokens[1].rows.base is back.stacked()[0] or np.shares_memory(back.tokens[1].rows, back.stacked()[0])
