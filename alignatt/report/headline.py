"""The Benchmarks page's opening lines: the headline results, each from its artifact.

One line per result (the served configuration, speakers per GPU at the capacity targets, one
speaker's round trip, the capture cost, quality at the low- and high-latency presets), each with
the date, commit and machine of the artifact it comes from and a link to the page section that
has the full table. A result with no artifact yet says so rather than disappearing.
"""

from __future__ import annotations

import re
from typing import Any

from alignatt.core.policy import PRESET_NAMES
from alignatt.record.artifacts import measured_on_gpu
from alignatt.report.inputs import ReportInputs

CAPACITY_SECTION = "Capacity (many speakers on one engine)"
QUALITY_BANDS = ("low_latency", "high_latency")  # the presets at either end of the latency range
QUALITY_TAIL = "noisy"  # an artifact from before the ASR-like transcript: its seeded tail noise


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return "#" + re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _stamp(a: Any) -> str:
    from alignatt.report.rows import machine_of

    commit = (a.provenance.git_commit or "no commit")[:7]
    return f"{a.provenance.date}, `{commit}`, {machine_of(a)}"


def _headline_profile_file(inputs: ReportInputs, name: str) -> tuple[str, Any] | None:
    """`<profile>/<name>` of the first profile measured on a GPU, else of any profile."""
    found = [(rel, a) for entries in inputs.by_kind.values() for rel, a in entries if rel.endswith(f"/{name}")
             and rel.count("/") == 2]
    found.sort(key=lambda t: (not measured_on_gpu(t[1]), t[0]))
    return found[0] if found else None


def headline(inputs: ReportInputs) -> list[dict[str, str]]:
    """The opening results, as `what`, `result`, `stamp` (date, commit, machine) and `link`."""
    from alignatt.measure.load_configurations import is_served_default, served_configuration
    from alignatt.report.capacity import configuration_words, judge_target, streams_of, target_level

    items = []
    capacity_link = anchor(CAPACITY_SECTION)
    found = _headline_profile_file(inputs, "load.json")
    if found is None:
        items.append(dict(what="Capacity", result="no `load` stage artifact yet", stamp="", link=capacity_link))
    else:
        rel, load = found
        stamp = _stamp(load)
        measured = next((lv for lv in load.levels
                         if is_served_default(lv.vllm_mode, load.config.seam, load.config.device)), None)
        served = served_configuration(load.config.seam, load.config.device).label()
        named = f" (`{served}`)" if served else ""
        items.append(dict(what="Served configuration",
                          result=(f"{configuration_words(load, measured.vllm_mode)}{named}" if measured else
                                  f"the served default{named}, not measured in `{rel}`"),
                          stamp=stamp, link=capacity_link))
        streams = ", ".join(streams_of(load))
        verdicts = []
        for target in (inputs.params.get("report") or {}).get("capacity_targets") or []:
            ok, said = judge_target(load, measured.vllm_mode, target, inputs, rel) if measured else (None, [])
            if ok is None:
                verdicts.append(f"{target['speakers']}: not measured")
                continue
            verdicts.append(f"{target['speakers']} {'met' if ok else '**missed**'} ({', '.join(said[:-1])})")
        met = [int(v.split(" ")[0]) for v in verdicts if v.split(" ")[1] == "met"]
        items.append(dict(what=f"Speakers per {_machine_short(load)} at the targets, `{streams}` stream",
                          result=(f"**{max(met)}** speakers meet their target" if met else "no target met")
                          + f" (served default; by speakers: {'; '.join(verdicts)})",
                          stamp=stamp, link=capacity_link))
        one, where = target_level(inputs, rel, load, measured.vllm_mode, 1, any_stream=True) if measured else (None, rel)
        if one is not None:
            beside = "" if where == rel else \
                f", {', '.join(streams_of(dict(inputs.of_kind('load'))[where]))} stream, in `{where}`"
            items.append(dict(what="One speaker's round trip", result=(
                f"partial-draft RTT p50 {one.partial_rtt_ms_p50:.0f} ms, p95 {one.partial_rtt_ms_p95:.0f} ms "
                f"(served default, alone on the engine{beside})"), stamp=stamp, link=capacity_link))
        items.append(_capture_cost(inputs, rel, load, capacity_link))
    items.extend(_quality(inputs))
    return items


def _capture_cost(inputs: ReportInputs, rel: str, load: Any, link: str) -> dict[str, str]:
    """The capture cost of the load stage's artifact; where that run skipped it (`capture_cost: off`),
    the newest load artifact beside it that measured it, named, with its own stamp."""
    what = "Capture cost (captured ÷ uncaptured draft wall)"
    if not load.capture_cost:
        folder = rel.rsplit("/", 1)[0]
        beside = [(r, a) for r, a in inputs.of_kind("load") if r.rsplit("/", 1)[0] == folder and a.capture_cost]
        if not beside:
            return dict(what=what, result=f"not measured in `{rel}`", stamp=_stamp(load), link=link)
        rel, load = max(beside, key=lambda t: t[1].provenance.timestamp_utc)
        what += f", from `{rel}`"
    costs = sorted(load.capture_cost, key=lambda c: c.batch)
    span = [costs[0]] + ([costs[-1]] if len(costs) > 1 else [])
    return dict(what=what, result=", ".join(f"**{c.ratio:.2f}×** at batch {c.batch}" for c in span)
                + f" ({costs[0].vllm_mode})", stamp=_stamp(load), link=link)


def _machine_short(a: Any) -> str:
    p = a.provenance
    return p.gpus[0].name.removeprefix("NVIDIA ") if p.gpus else "CPU"


def _quality(inputs: ReportInputs) -> list[dict[str, str]]:
    found = _headline_profile_file(inputs, "eval.json")
    if found is None:
        return [dict(what="Quality", result="no `eval` stage artifact yet", stamp="",
                     link=anchor("Translation quality and simultaneous latency"))]
    rel, a = found
    from alignatt.evaluate.outputs import (IWSLT_BANDS, MARK, below_zero_talk_rows, ca_stream_laal,
                                           headline_talk_rows, not_served_default, talk_rows_with_asr)
    from alignatt.report.rows import machine_of

    heading = (f"{a.config.test_set}: {a.config.model} on {machine_of(a)}, {a.provenance.date}"
               + (" — latency only (synthetic weights: BLEU is not a translation score)" if a.synthetic_weights else ""))
    rows = [r for r in a.rows if r.role == "quality" and r.form == "sentence" and r.driver == "inprocess"]
    talks = headline_talk_rows(a)  # whole talks, closed by the client, ASR-like errors: the field's setting
    asr_talks = talk_rows_with_asr(a)
    tail = QUALITY_TAIL if any(r.tail == QUALITY_TAIL for r in rows) else "asr"
    wer = max((r.committed_wer for r in rows if r.tail == "asr"), default=None)
    parts = []
    picked = dict(talks)
    for band, _ in IWSLT_BANDS if talks else ():  # a band without a row says so
        r = picked.get(band)
        parts.append(f"IWSLT {band} band: no row" if r is None else
                     f"IWSLT {band} band: `{r.preset}` BLEU **{r.bleu:.1f}** at StreamLAAL "
                     f"{r.latency['ca_stream_laal'] / 1000:.2f} s (computation-aware, real-time queue)")
    below = below_zero_talk_rows(a)
    timed = [r for r in asr_talks if 0 <= ca_stream_laal(r) < float("inf")]
    if timed and not talks:
        near = min(timed, key=lambda r: r.latency["ca_stream_laal"])
        cu = near.latency.get("stream_laal")
        parts.append("whole talks: no row within the IWSLT bands (StreamLAAL <= 4 s, computation-aware, real-time "
                     f"queue); nearest `{near.preset}` BLEU **{near.bleu:.1f}** at StreamLAAL "
                     f"{near.latency['ca_stream_laal'] / 1000:.2f} s"
                     + (f" ({cu / 1000:.2f} s computation-unaware)" if cu is not None else "") + _queue_note(a, near))
    if below:
        parts.append("in no band: " + ", ".join(f"`{r.preset}` (StreamLAAL {r.latency['ca_stream_laal'] / 1000:.2f} s"
                                                f"{MARK})" for r in below)
                     + ", below zero: mwerSegmenter put a weak translation's words in the wrong segments")
    for preset in PRESET_NAMES:  # the sentence rows at the same transcript, each preset that has one
        r = next((r for r in rows if r.preset == preset and r.tail == tail
                  and (tail != "asr" or r.committed_wer == wer)), None)
        if r is not None and r.bleu is not None and (talks or asr_talks or preset in QUALITY_BANDS):
            laal = r.latency.get("ca_laal_ms")
            parts.append(f"sentences, `{preset}` BLEU **{r.bleu:.1f}**"
                         + (f" at LAAL {laal / 1000:.2f} s (computation-aware)" if laal is not None else ""))
    offline = next((r for r in a.rows if r.role == "quality" and r.driver == "offline"), None)
    if offline is not None and offline.bleu is not None:
        parts.append(f"offline (whole sentence) {offline.bleu:.1f}")
    if not_served_default(a.config, a.provenance.gpu_name):  # the page scores what is served, or says not
        parts.append("**not the served default**: its section says which server configuration was scored")
    model = a.config.model
    caveat = " — synthetic weights: not a translation score" if a.synthetic_weights else ""
    if asr_talks:
        r = asr_talks[0]
        what = (f"Quality, {a.config.test_set} ({model}, {r.latency.get('talks')} whole talks, no oracle "
                f"segmentation, ASR-like transcript at {100 * r.committed_wer:g} % committed WER, N = "
                f"{r.instances} segments)")
    else:  # an artifact from before whole talks: sentences with their gold ends, as recorded
        what = (f"Quality, {a.config.test_set} ({model}, sentences with oracle ends, "
                + (f"{tail} ASR tail over gold committed words" if tail == QUALITY_TAIL
                   else f"ASR-like transcript at {100 * (wer or 0):g} % committed WER")
                + f", N = {rows[0].instances if rows else 0})")
    return [dict(what=what + caveat,
                 result="; ".join(parts) or "no scored rows", stamp=_stamp(a), link=anchor(heading))]


def _queue_note(a: Any, row: Any) -> str:
    """Why a computation-aware lag is long where the eval replayed many streams at once: each stream's
    round trip waits for the others' (the real-time queue convention charges it to the stream)."""
    if row.concurrency <= 1 or not row.updates:
        return ""
    note = (f"; the eval replayed {row.concurrency} streams at once, and a round trip averaged "
            f"{row.wall_ms / row.updates:.0f} ms")
    alone = next((r for r in a.rows if r.role == "under_load" and r.concurrency == 1 and r.updates), None)
    if alone is not None:
        note += f" ({alone.wall_ms / alone.updates:.0f} ms for one stream alone, quality under load)"
    return note
