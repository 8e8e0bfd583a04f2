"""The page's Artifacts table: every artifact it reads, with its date, where it ran (host, or the
image with its digest and id), the stack it ran on and its digest."""

from __future__ import annotations

from alignatt.record.artifacts import FingerprintArtifact, sha256_file
from alignatt.record.provenance import HOST
from alignatt.report.inputs import ReportInputs


def container_words(image: str, digest: str | None, image_id: str | None) -> str:
    """Where an artifact was measured: `host`, or the image with its digest and id (short)."""
    if image == HOST or not digest:
        return image
    return f"`{image}` {digest[:19]}" + (f", id {image_id[:19]}" if image_id else "")


def artifact_list(inputs: ReportInputs) -> list[dict[str, str]]:
    items = []
    for rel, a in inputs.published:
        items.append(dict(path=rel, kind=a.kind, schema="published (pre-schema)", date=a.date or "—",
                          torch=a.versions.get("torch") or "not recorded",
                          vllm=a.versions.get("vllm") or "not recorded", transformers="not recorded",
                          container="not recorded", sha256=sha256_file(inputs.root / rel)[:12]))
    ours = [v for kind in sorted(inputs.by_kind) for v in inputs.by_kind[kind]]
    for rel, a in sorted(ours, key=lambda t: t[0]):
        if isinstance(a, FingerprintArtifact):  # undated by design: what the stages depend on
            f = a.fingerprint
            items.append(dict(path=rel, kind=a.kind, schema=f"v{a.schema_version}", date="— (undated)",
                              torch=f.torch, vllm=f.vllm, transformers=f.transformers,
                              container=container_words(f.container_image, f.container_digest, None),
                              sha256=sha256_file(inputs.root / rel)[:12]))
            continue
        p = a.provenance
        items.append(dict(path=rel, kind=a.kind, schema=f"v{a.schema_version}", date=p.date,
                          torch=p.torch, vllm=p.vllm, transformers=p.transformers,
                          container=container_words(p.container_image, p.container_digest, p.container_image_id),
                          sha256=sha256_file(inputs.root / rel)[:12]))
    return items
