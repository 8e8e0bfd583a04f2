"""How a target language is counted: in characters where words are not spaced (zh, ja), in words
otherwise; and the sacrebleu tokenizer its BLEU uses. The scorers, the instance logs and the page
read these, so a direction is counted one way everywhere. Also why a lag in each unit can fall
below 0, which the scorers and the page both say."""

from __future__ import annotations

CHAR_LANGS = ("zh", "ja")


def bleu_tokenizer(target_lang: str) -> str:
    return {"zh": "zh", "ja": "ja-mecab"}.get(target_lang, "13a")


def counting_note(direction: str) -> str:
    """The page's line on how a direction's target side is counted."""
    lang = direction.rpartition("-")[2]
    unit = "characters" if lang in CHAR_LANGS else "words"
    return f"delays count target {unit}; BLEU tokenised by sacrebleu's {bleu_tokenizer(lang)}"


NEGATIVE_WHY = ("a lag below 0 means target unit i was written before the ideal simultaneous translator "
                "writes it, once (i-1)/gamma source units are in")
# Why, per unit the lag is counted in. A gold tail is the answer, but a metric that counts the tail
# as read cannot put a negative down to it (issue 39).
NEGATIVE_WHY_BY_UNIT = {
    "read": ("in words read (committed + tail shown) the tail's lookahead is already counted, so every "
             "negative there is output written ahead of what had been read: more target units than the "
             "source shown accounts for (an over-long or hallucinated output, or a guess at words not yet shown)"),
    "committed": ("in words committed, which leave the tail out, a negative can be the tail's lookahead "
                  "(a gold tail is the answer) as well as output written ahead of what had been read"),
    "ms": ("in ms (stream time against the source's duration) a negative is output written before its "
           "proportional share of the source had arrived; the tail shows words only once they arrive, so "
           "the lookahead does not explain it"),
    "longform": ("in long form (LongYAAL, StreamLAAL) a negative can also be output the resegmenter aligned "
                 "to a segment that it was emitted before (delays are taken from the segment's start)"),
}
NEGATIVE_UNITS = tuple(NEGATIVE_WHY_BY_UNIT)  # the page's order


def negative_unit(metric: str) -> str:
    """The unit a latency key counts in, for `NEGATIVE_WHY_BY_UNIT`: al_words_read -> read,
    laal_ms -> ms, ca_long_yaal -> longform; the words committed (and the `laal_words` of artifacts
    written before words read were) -> committed."""
    if "long_" in metric or "stream_" in metric:
        return "longform"
    if metric.endswith("_words_read"):
        return "read"
    if metric.endswith("_ms"):
        return "ms"
    return "committed"
