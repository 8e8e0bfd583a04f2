"""Four directions on one engine with the E4B architecture (synthetic weights; skipped without CUDA).

Run on the GPU host:  pytest tests/gpu/test_directions_gpu.py -m gpu -q -s
"""

import pytest

pytest.importorskip("torch")
from tests.gpu_marks import GPU_SERVER  # noqa: E402 - after the torch check

pytestmark = GPU_SERVER

DIRECTIONS = ("en-it", "en-zh", "en-cs", "cs-en")
SOURCES = {"en": "The house is small and the garden is large .".split(),
           "cs": "Dům je malý a zahrada je velká .".split()}


@pytest.mark.parametrize("seam", ["vllm_capture", "hf_qk_fast"])
def test_four_directions_run_on_one_engine_with_their_own_heads(seam):
    if seam == "vllm_capture":
        pytest.importorskip("vllm")
    from alignatt.heads.sets import load_head_set
    from alignatt.serve.config import DirectionRoute, ServerConfig
    from alignatt.serve.server import ServerThread
    from tests.support.server_client import Client

    route = DirectionRoute(model="gemma4-e4b-synthetic", seam=seam, device="cuda", top_k=4,
                           seam_options={"vllm_mode": "cudagraph"} if seam == "vllm_capture" else {})
    cfg = ServerConfig(port=0, directions={d: route for d in DIRECTIONS})
    with ServerThread(cfg) as srv:
        assert len(srv.server.registry.engines) == 1
        engine = srv.server.registry.engines[0]
        own = {d: [(h.layer, h.head) for h in load_head_set(f"gemma-4-E4B-it_{d}").top_k(4)] for d in DIRECTIONS}
        assert {(h.layer, h.head) for h in engine.heads} == {h for hs in own.values() for h in hs}
        print(f"{seam}: one engine, {len(engine.heads)} heads for {len(DIRECTIONS)} directions")
        for d in DIRECTIONS:
            with Client(srv.url, timeout=120) as c:
                ok = c.init(source_lang=d[:2], target_lang=d[3:])
                assert ok["direction"] == d and [tuple(h) for h in ok["heads"]] == own[d]
                assert ok["head_set"] == f"gemma-4-E4B-it_{d}"
                words = SOURCES[d[:2]]
                a = c.ask(words[:4], words[4:6])
                f = c.ask(words, final=True)
                assert a["type"] == f["type"] == "translation" and f["final"]
                assert f["committed_text"].startswith(a["committed_text"])
                print(f"  {d}: heads {ok['heads']} partial {a['compute_ms']:.1f} ms final {f['compute_ms']:.1f} ms")
        # a three-target session on the same engine: each frame names its target
        with Client(srv.url, timeout=120) as c:
            ok = c.init(source_lang="en", target_lang="it", target_langs=["it", "zh", "cs"])
            assert [t["target_lang"] for t in ok["targets"]] == ["it", "zh", "cs"]
            words = SOURCES["en"]
            c.update(words[:4], words[4:6])
            frames = [c.recv() for _ in range(3)]
            assert [fr["target_lang"] for fr in frames] == ["it", "zh", "cs"]
            print("  en->it,zh,cs in one batch:", [round(fr["compute_ms"], 1) for fr in frames], "ms")
