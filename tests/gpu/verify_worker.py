"""One vLLM engine with verified re-drafts, in its own process, for tests/gpu/test_vllm_verify.py.

Drafts a growing utterance one update at a time from scratch, then again with proposals: the
from-scratch draft itself (whole acceptance), it with a wrong first token (rejection at once), with
a wrong third token (partial), and the previous update's draft (what a session proposes). Then
each update whole and settled (stopped in the engine once the policy's answer is known), with the
whole draft cut by `core.settle.cut` as the reference; last, the load stage's verified-against-scratch
count (`measure/verify_equality.py`) on the same updates. Writes every draft's tokens, rows and
acceptance figures to an .npz.

`python -m tests.gpu.verify_worker SPEC.json OUT.npz`; SPEC: checkpoint, dtype, mode, heads,
tokens, kv_cache_memory_gib, verify.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from tests.gpu.batching_worker import open_seam, requests


def main(spec_path: str, out_path: str) -> int:
    from alignatt.core.draft import DraftProposal, SettleRule
    from alignatt.core.settle import cut

    spec = json.loads(Path(spec_path).read_text())
    seam = open_seam(spec, verify=spec["verify"])
    out: dict[str, np.ndarray] = {}

    def keep(name: str, d) -> None:
        out[f"{name}_tokens"] = np.asarray([t.token_id for t in d.tokens])
        out[f"{name}_rows"] = np.stack([t.rows for t in d.tokens]) if d.tokens else np.zeros((0, 0, 0))
        a = d.acceptance
        out[f"{name}_acceptance"] = np.asarray([a.proposed, a.accepted, a.decoded, a.forward_steps])

    try:
        previous = None
        for i, r in enumerate(requests(spec["tokens"])):
            scratch = seam.draft(r)
            keep(f"scratch_{i}", scratch)
            ids = [t.token_id for t in scratch.tokens]
            wrong = lambda t: (t + 1) % 1000  # noqa: E731 - another id
            proposals = {"whole": ids, "first": [wrong(ids[0])] + ids[1:],
                         "partial": ids[:2] + [wrong(ids[2])] + ids[3:]}
            if previous is not None:
                proposals["previous"] = previous
            for kind, p in proposals.items():
                keep(f"{kind}_{i}", seam.draft(replace(r, proposal=DraftProposal(tuple(p), r.target_prefix))))
            previous = ids
        out["totals"] = np.asarray(json.dumps(seam.acceptance_totals()))
        # Settled drafts (request.settle): stop at the first held token plus 2 of buffer. A border as
        # wide as the committed source holds every token, so each draft settles at 3 tokens; drafts
        # end at EOS here as served ones do (not fixed-length), and the whole draft is the reference.
        seam.fixed_length = False
        for i, r in enumerate(requests(spec["tokens"])):
            rule = SettleRule(border_words=r.committed_words, max_context_share=1.0, buffer_tokens=2)
            whole = seam.draft(r)
            expected = cut(replace(whole, request=replace(whole.request, settle=rule)))
            settled = seam.draft(replace(r, settle=rule))
            keep(f"unsettled_{i}", whole)
            keep(f"expected_{i}", expected)
            keep(f"settled_{i}", settled)
            out[f"settled_{i}_stop"] = np.asarray(settled.stop_reason)
            out[f"expected_{i}_stop"] = np.asarray(expected.stop_reason)
        # What the load stage measures on the bench prompts for a +verify configuration, here in fp32.
        from alignatt.measure.verify_equality import verified_against_scratch

        out["equality"] = np.asarray(json.dumps(verified_against_scratch(seam, requests(spec["tokens"]),
                                                                         decision_heads=len(spec["heads"]))))
    finally:
        seam.close()
    np.savez(out_path, **out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
