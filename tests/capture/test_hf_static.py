"""hf_qk_fast on a static cache (the loop its CUDA graph replays): same drafts and rows as eager,
and a step body that a graph can replay (no host value read inside it)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from alignatt.core.draft import DraftRequest, Head
from alignatt.core.errors import AlignattError
from alignatt.capture.hf.eager import HFEagerSeam
from alignatt.capture.hf.qk_fast import HFQKFastSeam
from alignatt.capture.hf.static_decode import BUCKET, bucket_length
from alignatt.checks.seam_parity import PARITY_TOLERANCE, compare_drafts
from tests.support import hf_cases
from tests.gpu_marks import NEEDS_CUDA


def some_requests(max_new_tokens=10):
    return [request for _, request in hf_cases.some_requests(max_new_tokens)]


def check_static_matches_eager(loaded, heads, requests):
    eager, static = HFEagerSeam(loaded, heads), HFQKFastSeam(loaded, heads, decode="static")
    dynamic = HFQKFastSeam(loaded, heads, decode="dynamic")
    rows_compared = 0
    for request in requests:
        reference, got = eager.draft(request), static.draft(request)
        compared, rows, masses, same = compare_drafts(reference, got)
        assert same and compared > 0
        assert rows <= PARITY_TOLERANCE and masses <= PARITY_TOLERANCE, (rows, masses)
        assert [t.token_id for t in dynamic.draft(request).tokens] == [t.token_id for t in got.tokens]
        rows_compared += compared
    return rows_compared


def test_static_decode_matches_eager_on_every_layer_kind(tiny_gemma4):
    """Sliding, full and KV-shared layers; sources longer than the sliding window."""
    assert check_static_matches_eager(tiny_gemma4, tiny_gemma4.layout.all_heads(), some_requests()) >= 4 * 32 * 5


def test_static_decode_on_the_multimodal_wrapper(tiny_gemma4):
    loaded = hf_cases.in_multimodal_wrapper(tiny_gemma4)
    assert check_static_matches_eager(loaded, loaded.layout.all_heads(), some_requests(6)[:1]) > 0


@pytest.mark.slow
def test_static_decode_matches_eager_on_the_embedded_model(gemma3_270m):
    heads = gemma3_270m.layout.all_heads()
    assert check_static_matches_eager(gemma3_270m, heads, some_requests(6)[:2]) > 0


def test_buckets_are_reused_and_a_stop_token_ends_the_draft(tiny_gemma4):
    seam = HFQKFastSeam(tiny_gemma4, [Head(4, 0)], decode="static")
    short, long_ = some_requests(8)[0], some_requests(8)[1]
    first = seam.draft(short)
    seam.draft(long_)
    seam.draft(short)
    assert set(seam._decoders) == {bucket_length(first.prompt_token_count + 8), bucket_length(
        seam.draft(long_).prompt_token_count + 8)}
    ids = [t.token_id for t in first.tokens]
    k = next(i for i, tok in enumerate(ids) if tok not in ids[:i])
    seam.stop_ids = {ids[k]}
    stopped = seam.draft(short)
    assert stopped.stop_reason == "eos" and [t.token_id for t in stopped.tokens] == ids[:k]
    assert bucket_length(1) == BUCKET and bucket_length(BUCKET + 1) == 2 * BUCKET


class HostReads(TorchDispatchMode):
    """Records ops that read a tensor's value on the host: inside a CUDA graph they would run once,
    at capture, and every replay would reuse the captured value."""

    SYNCING = ("_local_scalar_dense", "nonzero", "is_nonzero", "equal", "masked_select", "item")

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func.__name__.split(".")[0]
        if name in self.SYNCING:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_the_step_body_reads_no_host_values(tiny_gemma4):
    import alignatt.capture.hf.qk_fast as hq

    seam = HFQKFastSeam(tiny_gemma4, tiny_gemma4.layout.all_heads(), decode="static")
    request = some_requests(4)[0]
    seam.draft(request)  # builds the bucket's decoder and buffers
    decoder, _ = seam._static
    token = hq._ACTIVE.set(seam)  # the recording kernel is part of the step
    try:
        with torch.inference_mode():
            decoder.prefill([2, 3, 4])
            mode = HostReads()
            with mode:
                decoder._step_body()
    finally:
        hq._ACTIVE.reset(token)
    assert mode.ops > 100 and mode.seen == []
    # control: the mode does see a host read
    with HostReads() as control:
        int(torch.tensor([3]).sum())
    assert control.seen


def test_decode_mode_errors(tiny_gemma4):
    with pytest.raises(AlignattError, match="unknown hf_qk_fast decode mode 'fast'"):
        HFQKFastSeam(tiny_gemma4, [Head(0, 0)], decode="fast")
    if not torch.cuda.is_available():
        with pytest.raises(AlignattError, match="needs CUDA"):
            HFQKFastSeam(tiny_gemma4, [Head(0, 0)], decode="graph")
    assert HFQKFastSeam(tiny_gemma4, [Head(0, 0)]).decode_mode == (
        "graph" if tiny_gemma4.device == "cuda" else "dynamic")


def test_a_prompt_longer_than_the_model_allows_is_refused(tiny_gemma4):
    seam = HFQKFastSeam(tiny_gemma4, [Head(0, 0)], decode="static")
    limit = tiny_gemma4.model.config.max_position_embeddings
    with pytest.raises(AlignattError, match="exceeds the model's"):
        seam.draft(DraftRequest(source_words=["word"] * limit, committed_words=1, max_new_tokens=4))


# ---- GPU: the graph replays exactly what the uncaptured body computes ----


@pytest.mark.gpu
@NEEDS_CUDA
def test_graph_replay_is_bit_identical_to_the_uncaptured_step():
    from alignatt.models.presets import load_model

    loaded = load_model("tiny-gemma4", device="cuda", dtype="float32")
    heads = loaded.layout.all_heads()
    graph, static = HFQKFastSeam(loaded, heads, decode="graph"), HFQKFastSeam(loaded, heads, decode="static")
    for request in some_requests():
        a, b = graph.draft(request), static.draft(request)
        compared, rows, _, same = compare_drafts(a, b)
        assert same and compared > 0 and rows == 0.0
    assert all(d.graph is not None for d, _ in graph._decoders.values())
