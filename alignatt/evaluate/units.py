"""How a target language is counted: in characters where words are not spaced (zh, ja), in words
otherwise; and the sacrebleu tokenizer its BLEU uses. The scorers, the instance logs and the page
read these, so a direction is counted one way everywhere."""

from __future__ import annotations

CHAR_LANGS = ("zh", "ja")


def bleu_tokenizer(target_lang: str) -> str:
    return {"zh": "zh", "ja": "ja-mecab"}.get(target_lang, "13a")


def counting_note(direction: str) -> str:
    """The page's line on how a direction's target side is counted."""
    lang = direction.rpartition("-")[2]
    unit = "characters" if lang in CHAR_LANGS else "words"
    return f"delays count target {unit}; BLEU tokenised by sacrebleu's {bleu_tokenizer(lang)}"
