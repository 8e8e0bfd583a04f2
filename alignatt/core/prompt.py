"""The translation prompt, and exactly which prompt tokens hold each source word.

Instruction-tuned models (Gemma-4-it, Gemma-3-it, the tiny test model) get their own chat
template: a system instruction, the source text as the user turn, and the accepted target prefix
appended after the generation prompt, so the model continues its own (assistant) turn. A base
model without a chat template (the embedded Gemma-3-270M) gets a short few-shot prompt instead.

The whole prompt is tokenized in one go (the model sees its canonical tokenization) and the
tokenizer's character offsets map every token that overlaps a source word to that word, so a
frontier in words becomes a frontier in token positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from alignatt.core.draft import DraftRequest
from alignatt.core.errors import AlignattError

LANGUAGE_NAMES = {
    "en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian",
    "pt": "Portuguese", "nl": "Dutch", "pl": "Polish", "cs": "Czech", "ru": "Russian",
    "uk": "Ukrainian", "ja": "Japanese", "zh": "Chinese", "ko": "Korean", "ar": "Arabic",
    "tr": "Turkish", "sv": "Swedish", "da": "Danish", "fi": "Finnish", "hu": "Hungarian",
}

SYSTEM_INSTRUCTION = (
    "Translate the following {src} text into {tgt}. The text is a live transcript and may stop "
    "mid-sentence. Output only the {tgt} translation, nothing else."
)

# Few-shot pairs for base models, keyed by (source, target) language; other pairs go zero-shot.
FEW_SHOT_EXAMPLES: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("en", "de"): [
        ("The house is small.", "Das Haus ist klein."),
        ("I would like to order a coffee, please.", "Ich möchte bitte einen Kaffee bestellen."),
        ("We met at the station yesterday.", "Wir haben uns gestern am Bahnhof getroffen."),
    ],
}


@dataclass
class PromptLayout:
    text: str
    input_ids: list[int]
    source_token_positions: list[int]  # absolute positions of source tokens, ascending
    source_word_of_token: list[int]  # for each of those positions, its source word index
    prefix_start: int  # first position of the accepted target prefix (== len when no prefix)
    style: Literal["chat", "few_shot"]
    stop_at_newline: bool  # few-shot drafts end at a line break (the next example would follow)

    def word_token_positions(self, word: int) -> list[int]:
        return [p for p, w in zip(self.source_token_positions, self.source_word_of_token) if w == word]


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


def build_prompt(tokenizer: Any, request: DraftRequest) -> PromptLayout:
    words = [w.strip() for w in request.source_words]
    for i, w in enumerate(words):
        if not w or any(c.isspace() for c in w):
            raise AlignattError(f"source word {i} ({request.source_words[i]!r}) is empty or contains whitespace")
    source = " ".join(words)
    prefix = request.target_prefix.strip()
    src, tgt = language_name(request.source_lang), language_name(request.target_lang)

    if getattr(tokenizer, "chat_template", None):
        style: Literal["chat", "few_shot"] = "chat"
        base = _render_chat(tokenizer, SYSTEM_INSTRUCTION.format(src=src, tgt=tgt), source)
        text = base + prefix
    else:
        style = "few_shot"
        base = _few_shot(request.source_lang, request.target_lang, src, tgt, source)
        bos = getattr(tokenizer, "bos_token", None)
        if bos and not base.startswith(bos):
            base = bos + base
        text = base + (" " + prefix if prefix else "")

    start = base.rfind(source)
    if start < 0:
        raise AlignattError("the chat template altered the source text; cannot locate source words")
    word_spans, cursor = [], start
    for w in words:
        word_spans.append((cursor, cursor + len(w)))
        cursor += len(w) + 1

    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    positions, word_of = [], []
    for pos, (a, b) in enumerate(offsets):
        if b <= a or b <= start or a >= cursor:
            continue
        for w, (ws, we) in enumerate(word_spans):
            if a < we and b > ws:  # first overlapping word owns the token
                positions.append(pos)
                word_of.append(w)
                break
    missing = sorted(set(range(len(words))) - set(word_of))
    if missing:
        raise AlignattError(
            f"source words {missing} got no token of their own (tokenizer merged across words)"
        )
    prefix_start = next((i for i, (a, _) in enumerate(offsets) if a >= len(base) and prefix), len(ids))
    return PromptLayout(
        text=text,
        input_ids=ids,
        source_token_positions=positions,
        source_word_of_token=word_of,
        prefix_start=prefix_start,
        style=style,
        stop_at_newline=style == "few_shot",
    )


def _render_chat(tokenizer: Any, instruction: str, source: str) -> str:
    messages = [{"role": "system", "content": instruction}, {"role": "user", "content": source}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # templates without a system role: fold the instruction into the user turn
        merged = [{"role": "user", "content": f"{instruction}\n\n{source}"}]
        return tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)


def _few_shot(src_code: str, tgt_code: str, src: str, tgt: str, source: str) -> str:
    lines = [f"Translate {src} to {tgt}.", ""]
    for s, t in FEW_SHOT_EXAMPLES.get((src_code, tgt_code), []):
        lines += [f"{src}: {s}", f"{tgt}: {t}", ""]
    lines += [f"{src}: {source}", f"{tgt}:"]
    return "\n".join(lines)
