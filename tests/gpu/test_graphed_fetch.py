"""GPU: the capture's fetch replayed as CUDA graphs gives every request the reference rows.

The stand-in engine of tests/capture/test_vllm_fetch.py on the GPU: batches of random requests go
through the graphed fetch (the default on CUDA), again and again in the same padded shapes, so that
graphs are replayed on new data, after shapes that outgrew the shared buffers."""

import pytest

from tests.capture.test_vllm_fetch import StandInEngine, assert_same_rows, random_batch
from tests.gpu_marks import GPU

pytestmark = GPU


def test_graphed_fetch_replays_give_each_batch_its_own_reference_rows():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    graphed = StandInEngine(n_blocks=(40, 80), device="cuda")
    assert graphed.fetcher.graphs is not None  # on by default on a GPU
    captured = []
    # Round 1 grows the buffers (dropping the graphs captured before, and their pool) and captures;
    # round 2 captures again what a growth dropped; round 3 has every layout's graph: it only replays.
    for round_ in range(3):
        for seed in range(6):
            reference = StandInEngine(n_blocks=(40, 80))
            items, ref_items = random_batch(seed, [graphed, reference], n_requests=2 + seed % 5,
                                            name=f"{round_}-")
            got, _ = graphed.fetcher.enqueue(items).result()
            for g, ref_item in zip(got, ref_items):
                assert_same_rows(g, reference.fetcher.fetch_one(ref_item)[0], atol=1e-5)  # GPU against CPU
        captured.append(graphed.fetcher.graphs.captured)
    runs = graphed.fetcher.graphs
    assert runs.replays == 18
    assert runs.regrown >= 2  # a growth after the first capture: graphs and pool dropped, captured anew
    assert 1 <= captured[1] == captured[2]  # the third round replayed, captured nothing
