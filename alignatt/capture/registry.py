"""The seam registry: one name per capture seam, one factory that builds any of them.

`hf_eager` and `hf_qk_fast` run on transformers anywhere (CPU or CUDA); `vllm_capture` needs
CUDA and vLLM 0.22.1 and lives in `alignatt.capture.vllm.seam` (imported only when asked for).
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from typing import Any

from alignatt.capture.names import DEFAULT_SEAM, HF_QK_FAST, SEAMS
from alignatt.core.draft import Draft, DraftRequest, Head, Seam
from alignatt.core.errors import AlignattError
from alignatt.models.presets import DEFAULT_MODEL


def make_seam(
    name: str,
    model: str = DEFAULT_MODEL,
    heads: list[Head] | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    **options: Any,
) -> Seam:
    """Build a seam by name; loading happens here. Raises AlignattError when it cannot run here."""
    if name not in SEAMS:
        raise AlignattError(f"unknown seam {name!r}: use one of {', '.join(SEAMS)}")
    if name == "vllm_capture":
        _check_vllm_can_run()
    if heads is None:
        from alignatt.heads.sets import default_heads

        heads = default_heads(model, 4)
    if name == "vllm_capture":
        from alignatt.capture.vllm import seam as vllm_capture

        device = "cuda" if device == "cpu" else device
        return vllm_capture.make_seam(model=model, heads=heads, device=device, dtype=dtype, **options)
    allowed = {"decode", "verify"} if name == HF_QK_FAST else {"verify"}
    if set(options) - allowed:
        raise AlignattError(f"seam {name} does not take {', '.join(sorted(set(options) - allowed))}")
    from alignatt.models.presets import load_model

    loaded = load_model(model, device=device, dtype=dtype)
    if name == "hf_eager":
        from alignatt.capture.hf.eager import HFEagerSeam

        return HFEagerSeam(loaded, heads, verify=options.get("verify", True))
    from alignatt.capture.hf.qk_fast import HFQKFastSeam

    return HFQKFastSeam(loaded, heads, decode=options.get("decode"), verify=options.get("verify", True))


def _check_vllm_can_run() -> None:
    reason = ""
    try:
        import torch

        if not torch.cuda.is_available():
            reason = "CUDA is not available here"
    except ImportError as e:  # pragma: no cover - torch is a hard dependency
        reason = str(e)
    if not reason:
        try:
            import alignatt.capture.vllm.seam  # noqa: F401 - vLLM itself is imported when the engine starts
        except ImportError as e:
            reason = f"cannot import it ({e})"
    if reason:
        raise AlignattError(f"vllm_capture needs CUDA and vLLM 0.22.1: {reason}")


# ---- one draft + AlignAtt decision, for `alignatt translate` ----


@dataclass
class Translation:
    model: str
    seam: str
    draft: Draft
    policy: Any  # alignatt.core.policy.PolicyResult

    def as_dict(self) -> dict[str, Any]:
        d, t = self.draft, self.draft.timings
        return {
            "model": self.model,
            "seam": self.seam,
            "source_words": d.request.source_words,
            "committed_words": d.request.committed_words,
            "target_prefix": d.request.target_prefix,
            "heads": [[h.layer, h.head] for h in d.heads],
            "draft_text": d.text,
            "draft_stop_reason": d.stop_reason,
            "prompt_token_count": d.prompt_token_count,
            "timings_ms": {
                "prefill": t.prefill_ms, "decode": t.decode_ms, "capture": t.capture_ms,
                "reconstruct": t.reconstruct_ms, "per_token": t.per_token_ms(len(d.tokens)),
            },
            **self.policy.as_dict(),
        }


def parse_heads(specs: list[str]) -> list[Head]:
    """Heads from 'LAYER:HEAD[,LAYER:HEAD...]' strings (range-checked later against the layout)."""
    from alignatt.heads.sets import parse_head_spec

    return [h for spec in specs for h in parse_head_spec(spec)]


def translate(
    source: str,
    committed_words: int | None = None,
    prefix: str = "",
    seam: str = DEFAULT_SEAM,
    model: str = DEFAULT_MODEL,
    heads_k: int = 4,
    heads: list[Head] | None = None,
    max_new_tokens: int = 20,
    policy: str = "balanced",
    final: bool = False,
    device: str = "cpu",
    dtype: str | None = None,
) -> Translation:
    """Draft once on `source` (committed words first, then the unstable tail) and judge it."""
    from alignatt.core.policy import POLICY_PRESETS, decide

    words = source.split()
    if not words:
        raise AlignattError("empty source: give at least one source word")
    committed = len(words) if committed_words is None else committed_words
    if not 0 <= committed <= len(words):
        raise AlignattError(f"--committed-words {committed} outside 0..{len(words)} (the source has {len(words)} words)")
    if max_new_tokens < 1:
        raise AlignattError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if heads_k < 1:
        raise AlignattError(f"--heads must be >= 1, got {heads_k}")
    if policy not in POLICY_PRESETS:
        raise AlignattError(f"unknown policy preset {policy!r}: use one of {', '.join(POLICY_PRESETS)}")
    if seam not in SEAMS:
        raise AlignattError(f"unknown seam {seam!r}: use one of {', '.join(SEAMS)}")
    from alignatt.models.presets import check_model_name

    check_model_name(model)  # before head lookup, so an unknown model says so
    if heads is None:
        from alignatt.heads.sets import default_heads

        heads = default_heads(model, heads_k)
    request = DraftRequest(source_words=words, committed_words=committed, target_prefix=prefix,
                           max_new_tokens=max_new_tokens)
    with closing(make_seam(seam, model=model, heads=heads, device=device, dtype=dtype)) as built:
        draft = built.draft(request)
    return Translation(model=model, seam=seam, draft=draft,
                       policy=decide(draft, committed, POLICY_PRESETS[policy], final=final))


def describe_translation(tr: Translation) -> str:
    d, p = tr.draft, tr.policy
    words = d.request.source_words
    shown = words[: d.request.committed_words] + ["|"] + words[d.request.committed_words:]
    lines = [
        f"model {tr.model}  seam {tr.seam}  heads {' '.join(f'{h.layer}:{h.head}' for h in d.heads)}",
        f"source:  {' '.join(shown)}   (| = committed frontier, {d.request.committed_words}/{len(words)} words)",
    ]
    if d.request.target_prefix:
        lines.append(f"prefix:  {d.request.target_prefix}")
    lines += [
        f"draft:   {d.text!r}  ({len(d.tokens)} tokens, stop: {d.stop_reason}, "
        f"{d.timings.per_token_ms(len(d.tokens)):.1f} ms/token)",
        f"emitted: {p.emitted_text!r}",
        f"held:    {p.held_text!r}  (stop: {p.stop_reason})",
        "",
        f"{'#':>3}  {'token':<16} {'aligned source word':<24} {'acc':>5} {'inacc':>5} {'other':>5} {'gen':>5}  decision",
    ]
    for dec in p.decisions:
        m = dec.mass
        aligned = f"{dec.aligned_word} {dec.aligned_text}"
        lines.append(
            f"{dec.index:>3}  {dec.piece!r:<16} {aligned:<24} {m['accessible']:5.2f} {m['inaccessible']:5.2f} "
            f"{m['other_prompt']:5.2f} {m['generated']:5.2f}  {'emit' if dec.emit else 'hold'} ({dec.reason})"
        )
    return "\n".join(lines)
