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
