"""How far a BLEU or chrF can be trusted: sacrebleu's bootstrap intervals and its paired tests.

No resampling is written here:
- the 95 % interval of a row's BLEU and chrF is sacrebleu's `corpus_score(..., n_bootstrap=B)`
  (percentile bootstrap over sentences; sacrebleu reports mean ± half-width, and so do we:
  low = mean - half-width, high = mean + half-width);
- each preset's paired test against the offline baseline of the same variant is sacrebleu's
  `PairedTest` (approximate randomization, `ar`, or paired bootstrap, `bs`), on the same sentences.
Both are seeded by sacrebleu's `SACREBLEU_SEED` (default 12345), so a re-run gives the same figures.

Two guards, both recorded: an interval is clipped to the metric's range [0, 100] (mean ± half-width
can pass 100 on a few sentences; the half-width is kept as sacrebleu gave it); and a metric whose
observed difference to the baseline is exactly 0 gets p = 1, because sacrebleu's tests (after
multeval) count resampled differences strictly greater than the observed one, so a system
identical to the baseline would otherwise come out "significant" at p = 1/(samples + 1).

N is the number of sentences resampled. Below `MIN_SENTENCES_FOR_A_CURVE` a quality-latency curve
is not a result (the page says so); with N sentences a bootstrap has only C(2N-1, N) distinct
resamples (3 for N = 2), which the interval records.

Multiple comparisons: an artifact (one direction) tests every preset row against offline in two
metrics, so its p-values are one family; `holm` adjusts them (Holm-Bonferroni step-down, which
controls the family-wise error rate at the level), and a row is `significant` only when both its
BLEU and its chrF adjusted p are below the level (`holm_verdicts`). The page recomputes the same
from the recorded raw p, so artifacts written before the correction read the same way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Literal

from alignatt.record.artifacts.options import DEFAULT_BOOTSTRAP  # an eval knob's default

MIN_SENTENCES_FOR_A_CURVE = 100
SIGNIFICANCE_LEVEL = 0.05
TEST_NAMES = {"ar": "paired approximate randomization (sacrebleu)", "bs": "paired bootstrap resampling (sacrebleu)"}


TESTED_METRICS = ("bleu", "chrf")  # the metrics of a paired test: both must pass for `significant`


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given: the k-th smallest of m is multiplied by
    m - k + 1 (k from 1), made non-decreasing along that order and capped at 1. Rejecting where the
    adjusted p is below the level is Holm's step-down procedure at that level."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def holm_verdicts(tests: Sequence[dict], level: float = SIGNIFICANCE_LEVEL) -> list[dict]:
    """One family of paired tests (each a dict with `bleu_p`, `chrf_p` and optionally `resolvable`):
    per test, its Holm-adjusted p per metric, the family's size, and `significant`: resolvable and
    both metrics' adjusted p below the level."""
    raw = [float(t[f"{m}_p"]) for t in tests for m in TESTED_METRICS]
    adjusted = holm(raw)
    k = len(TESTED_METRICS)
    out = []
    for i, t in enumerate(tests):
        adj = {m: adjusted[k * i + j] for j, m in enumerate(TESTED_METRICS)}
        out.append({**{f"{m}_p_holm": round(adj[m], 4) for m in TESTED_METRICS}, "family": len(raw),
                    "significant": bool(t.get("resolvable", True)) and all(adj[m] < level for m in TESTED_METRICS)})
    return out


def _metrics(target_lang: str):
    from sacrebleu.metrics import BLEU, CHRF

    from alignatt.evaluate.units import bleu_tokenizer

    return {"bleu": _python_float_scores(BLEU(tokenize=bleu_tokenizer(target_lang))),
            "chrf": _python_float_scores(CHRF())}


def _python_float_scores(metric):
    """`metric`, its every score a Python float. sacrebleu 2.6 resamples float32 statistics, so a
    resampled chrF is a numpy float32, except a resample with no character match, which is the
    Python float 0.0; `statistics.mean` in its interval then refuses the mix ("don't know how to
    coerce float and float32"). Seen on the H200 with synthetic weights, where such resamples occur."""
    compute = metric._compute_score_from_stats

    def scored(stats):
        score = compute(stats)
        score.score = float(score.score)
        return score

    metric._compute_score_from_stats = scored  # the instance's own: sacrebleu calls it for every resample
    return metric


def _seed() -> str:
    return os.environ.get("SACREBLEU_SEED", "12345").lower()


def distinct_resamples(n: int) -> int | None:
    """Multisets of n sentences drawn from n: C(2n-1, n); None past a billion (no longer a limit)."""
    if n <= 0:
        return 0
    value = math.comb(2 * n - 1, n)
    return value if value < 10 ** 9 else None


def intervals(hypotheses: list[str], references: list[str], target_lang: str,
              resamples: int = DEFAULT_BOOTSTRAP) -> dict[str, dict]:
    """{"bleu": {...}, "chrf": {...}}: the score, sacrebleu's bootstrap mean and 95 % interval, N."""
    out = {}
    n = len(hypotheses)
    for name, metric in _metrics(target_lang).items():
        if n < 2 or resamples < 2:
            s = metric.corpus_score(hypotheses, [references])
            mean, half = s.score, 0.0  # one sentence: every resample is the same sentence
        else:
            s = metric.corpus_score(hypotheses, [references], n_bootstrap=resamples)
            mean, half = float(s._mean), float(s._ci)  # sacrebleu's fields for its "μ = mean ± ci" output
        out[name] = {"score": round(float(s.score), 4), "mean": round(mean, 4),
                     "low": round(max(0.0, mean - half), 4), "high": round(min(100.0, mean + half), 4),
                     "half_width": round(half, 4), "confidence": 0.95,
                     "resamples": resamples if n >= 2 else 1, "n": n, "seed": _seed(),
                     "distinct_resamples": distinct_resamples(n)}
        if name == "bleu":  # why a streaming row can score above offline: a shorter output pays BP < 1
            out[name].update({"bp": round(float(s.bp), 4), "sys_len": int(s.sys_len), "ref_len": int(s.ref_len)})
    return out


def paired_tests(baseline: list[str], systems: dict[str, list[str]], references: list[str], target_lang: str,
                 method: Literal["ar", "bs"] = "ar", samples: int = 0) -> dict[str, dict]:
    """Each system against the baseline on the same sentences: sacrebleu's `PairedTest`, p per metric.
    `samples` 0: sacrebleu's default (10000 trials for ar, 1000 resamples for bs)."""
    from sacrebleu.significance import PairedTest

    if not systems:
        return {}
    n = len(baseline)
    if any(len(h) != n for h in systems.values()) or len(references) != n:
        raise ValueError("a paired test needs the same sentences in every system")
    names = list(systems)
    metrics = _metrics(target_lang)
    test = PairedTest([("baseline", baseline), *[(k, systems[k]) for k in names]],
                      {k.upper(): m for k, m in metrics.items()}, [references], test_type=method,
                      n_samples=samples, n_ar_confidence=-1)
    _, scores = test()
    # PairedTest keys its columns by the metric's name (BLEU, chrF2); map them back to ours.
    columns = {k: v for k, v in scores.items() if k != "System"}
    by_ours = {}
    for ours in metrics:
        key = next(c for c in columns if c.lower().startswith(ours))
        by_ours[ours] = columns[key]
    base = {m: float(by_ours[m][0].score) for m in metrics}
    out = {}
    for i, name in enumerate(names, start=1):
        p, no_difference = {}, []
        for m in metrics:
            if float(by_ours[m][i].score) == base[m]:
                p[m] = 1.0
                no_difference.append(m)
            else:
                p[m] = round(float(by_ours[m][i].p_value), 4)
        # A resampling test over N sentences has at most C(2N-1, N) distinct bootstrap resamples
        # (2^N swap patterns for ar); with fewer than 1/level of them it cannot resolve p < level
        # (sacrebleu still prints p = 1/(samples+1)): such a p is reported, never "significant".
        distinct = distinct_resamples(n) if method == "bs" else 2 ** n
        resolvable = distinct is None or distinct >= 1 / SIGNIFICANCE_LEVEL
        out[name] = {"no_difference": no_difference, "resolvable": resolvable, "method": method, "description": TEST_NAMES[method], "samples": test.n_samples, "n": n,
                     "seed": _seed(), "bleu_p": p["bleu"], "chrf_p": p["chrf"],
                     # both metrics, before the family's correction (`holm_verdicts` settles it)
                     "significant": resolvable and all(p[m] < SIGNIFICANCE_LEVEL for m in TESTED_METRICS),
                     "level": SIGNIFICANCE_LEVEL}
    return out
