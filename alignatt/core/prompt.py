"""The translation prompt, and exactly which prompt tokens hold each source word.

Instruction-tuned models (Gemma-4-it, Gemma-3-it, the tiny test model) get their own chat
template: a system instruction, the source text as the user turn, and the accepted target prefix
appended after the generation prompt, so the model continues its own (assistant) turn. A base
model without a chat template (the embedded Gemma-3-270M) gets a short few-shot prompt instead.

Outside the source region the prompt may hold a bounded background/glossary block
(`context_text`, in the system turn or under a header line) and earlier turns (`history`, as
previous user/assistant turns or previous example lines). Their token positions are reported
apart from the source's, so the policy can tell attention on them from attention on the source.

The whole prompt is tokenized in one go (the model sees its canonical tokenization) and the
tokenizer's character offsets map every token that overlaps a source word to that word, so a
frontier in words becomes a frontier in token positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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

CONTEXT_HEADER = "Background and glossary (reference only, do not translate)"


class ContextConfig(BaseModel):
    """How much context and history a session puts in its prompt, and the bounds it accepts."""

    model_config = ConfigDict(extra="forbid")

    history_pairs: int = Field(3, ge=0, description="earlier [source, target] turns in the prompt (0: none)")
    history_window: Literal["sliding", "chunked"] = Field(
        "sliding", description="sliding: the last history_pairs turns, so each closed utterance shifts them all "
                               "and the prompt after the instructions is new to the engine's prefix cache; "
                               "chunked: turns accumulate to 2 x history_pairs - 1, then the last history_pairs "
                               "stay, so between two cuts a closed utterance only appends to the prompt")
    max_context_chars: int = Field(2000, ge=0, description="longer context_text is refused")
    max_history_entry_chars: int = Field(1000, ge=1, description="longer history texts are refused")


def recent_history(history: list[tuple[str, str]], config: ContextConfig) -> list[tuple[str, str]]:
    """The turns a prompt holds (oldest first), by `history_window`: the last `history_pairs`, or,
    chunked, all of them up to 2 x history_pairs - 1 and the last `history_pairs` past that; 0 keeps none."""
    pairs = config.history_pairs
    if not pairs:
        return []
    keep = pairs if config.history_window == "sliding" or len(history) > 2 * pairs - 1 else len(history)
    return [tuple(p) for p in history[max(len(history) - keep, 0):]]


# Few-shot pairs for base models, keyed by (source, target) language; other pairs go zero-shot.
FEW_SHOT_EXAMPLES: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("en", "de"): [
        ("The house is small.", "Das Haus ist klein."),
        ("I would like to order a coffee, please.", "Ich möchte bitte einen Kaffee bestellen."),
        ("We met at the station yesterday.", "Wir haben uns gestern am Bahnhof getroffen."),
    ],
    ("en", "it"): [
        ("The house is small.", "La casa è piccola."),
        ("I would like to order a coffee, please.", "Vorrei ordinare un caffè, per favore."),
        ("We met at the station yesterday.", "Ci siamo incontrati ieri alla stazione."),
    ],
    ("en", "zh"): [
        ("The house is small.", "这座房子很小。"),
        ("I would like to order a coffee, please.", "我想点一杯咖啡。"),
        ("We met at the station yesterday.", "我们昨天在车站见了面。"),
    ],
    ("en", "cs"): [
        ("The house is small.", "Dům je malý."),
        ("I would like to order a coffee, please.", "Chtěl bych si objednat kávu, prosím."),
        ("We met at the station yesterday.", "Včera jsme se potkali na nádraží."),
    ],
    ("cs", "en"): [
        ("Dům je malý.", "The house is small."),
        ("Chtěl bych si objednat kávu, prosím.", "I would like to order a coffee, please."),
        ("Včera jsme se potkali na nádraží.", "We met at the station yesterday."),
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
    context_token_positions: list[int] = field(default_factory=list)  # the context block's tokens
    history_token_positions: list[int] = field(default_factory=list)  # the earlier turns' tokens

    def word_token_positions(self, word: int) -> list[int]:
        return [p for p, w in zip(self.source_token_positions, self.source_word_of_token) if w == word]


# Where a prompt's tokens sit, in order: what changes between two updates of a session is in the
# source (new and revised words) and everything after it, which a prefix cache cannot serve.
PROMPT_REGIONS = ("before the source", "source", "after the source", "target prefix")


def uncached_by_region(layout: PromptLayout, cached: int) -> dict[str, int]:
    """The prompt's tokens past its first `cached` (those a prefix cache did not serve), by region:
    before the source (instructions, examples, context, history, the turn's start), the source, after
    it (the turn's end and the generation prompt) and the accepted target prefix."""
    src = layout.source_token_positions
    start, end = (src[0], src[-1] + 1) if src else (layout.prefix_start, layout.prefix_start)
    bounds = (0, start, end, layout.prefix_start, len(layout.input_ids))
    return {name: max(0, b - max(a, cached)) for name, a, b in zip(PROMPT_REGIONS, bounds, bounds[1:])}


@dataclass
class PrefixCacheCounts:
    """What a prefix cache served of the finished drafts' prompts, and where the rest sat
    (the keys are those of a seam's `describe()`)."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    uncached_prompt_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROMPT_REGIONS, 0))
    prompt_drafts: int = 0

    def add(self, layout: PromptLayout, cached: int) -> None:
        """One finished draft whose prompt's first `cached` tokens the cache served."""
        self.prompt_tokens += len(layout.input_ids)
        self.cached_prompt_tokens += cached
        self.prompt_drafts += 1
        for region, n in uncached_by_region(layout, cached).items():
            self.uncached_prompt_tokens[region] += n

    def describe(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
                "uncached_prompt_tokens": dict(self.uncached_prompt_tokens), "prompt_drafts": self.prompt_drafts}


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def build_prompt(tokenizer: Any, request: DraftRequest) -> PromptLayout:
    words = [w.strip() for w in request.source_words]
    for i, w in enumerate(words):
        if not w or any(c.isspace() for c in w):
            raise AlignattError(f"source word {i} ({request.source_words[i]!r}) is empty or contains whitespace")
    source = " ".join(words)
    prefix = request.target_prefix.strip()
    src, tgt = language_name(request.source_lang), language_name(request.target_lang)
    context = request.context_text.strip()
    history = [(_one_line(a), _one_line(b)) for a, b in request.history if _one_line(a) and _one_line(b)]

    if getattr(tokenizer, "chat_template", None):
        style: Literal["chat", "few_shot"] = "chat"
        instruction = SYSTEM_INSTRUCTION.format(src=src, tgt=tgt)

        def render(text: str) -> str:
            return _render_chat(tokenizer, instruction, context, history, text)

        base, start = _render_with_source(render, source)
        after = base.find(instruction)
        after = after + len(instruction) if after >= 0 else 0
        text = base + prefix
    else:
        style = "few_shot"
        bos = getattr(tokenizer, "bos_token", None) or ""

        examples_end: list[int] = []  # where the fixed examples end, from the last render

        def render(text: str) -> str:
            rendered, end = _few_shot(request.source_lang, request.target_lang, src, tgt, context, history, text)
            if not rendered.startswith(bos):
                rendered, end = bos + rendered, end + len(bos)
            examples_end.append(end)
            return rendered

        base, start = _render_with_source(render, source)
        after = examples_end[-1]
        text = base + (" " + prefix if prefix else "")

    # Context, then history, then the source, each searched after the one before it.
    context_spans, history_spans, cursor = [], [], after
    if context:
        at = base.find(context, cursor)
        if at < 0:
            raise AlignattError("the chat template altered the context text; cannot locate it")
        context_spans.append((at, at + len(context)))
        cursor = at + len(context)
    for turn in history:
        for part in turn:
            at = base.find(part, cursor)
            if at < 0:
                raise AlignattError("the chat template altered a history turn; cannot locate it")
            history_spans.append((at, at + len(part)))
            cursor = at + len(part)
    if start < cursor:
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
        context_token_positions=_overlapping(offsets, context_spans),
        history_token_positions=_overlapping(offsets, history_spans),
    )


# Stands for the source while the template renders, so the source is found where the template put
# it, not wherever its text happens to occur (a word like "r" or "user" is also in the template).
SOURCE_MARK = "\ue000alignatt-source\ue001"


def _render_with_source(render, source: str) -> tuple[str, int]:
    """The prompt rendered with `source`, and where the source starts in it."""
    marked = render(SOURCE_MARK)
    at = marked.find(SOURCE_MARK)
    base = render(source)
    if at < 0 or marked.count(SOURCE_MARK) != 1 or base != marked[:at] + source + marked[at + len(SOURCE_MARK):]:
        raise AlignattError("the chat template altered the source text; cannot locate source words")
    return base, at


def _overlapping(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Token positions whose characters overlap any of the spans."""
    return [pos for pos, (a, b) in enumerate(offsets) if b > a and any(a < e and b > s for s, e in spans)]


def _render_chat(tokenizer: Any, instruction: str, context: str, history: list[tuple[str, str]],
                 source: str) -> str:
    system = f"{instruction}\n\n{CONTEXT_HEADER}:\n{context}" if context else instruction
    turns = []
    for s, t in history:
        turns += [{"role": "user", "content": s}, {"role": "assistant", "content": t}]
    messages = [{"role": "system", "content": system}, *turns, {"role": "user", "content": source}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # templates without a system role: fold the instruction into the first user turn
        first = turns[0]["content"] if turns else source
        merged = [{"role": "user", "content": f"{system}\n\n{first}"}, *turns[1:],
                  *([{"role": "user", "content": source}] if turns else [])]
        return tokenizer.apply_chat_template(merged, tokenize=False, add_generation_prompt=True)


def _few_shot(src_code: str, tgt_code: str, src: str, tgt: str, context: str,
              history: list[tuple[str, str]], source: str) -> tuple[str, int]:
    """The few-shot prompt and where its fixed examples end (context and history come after)."""
    lines = [f"Translate {src} to {tgt}.", ""]
    for s, t in FEW_SHOT_EXAMPLES.get((src_code, tgt_code), []):
        lines += [f"{src}: {s}", f"{tgt}: {t}", ""]
    examples_end = len("\n".join(lines))
    if context:
        lines += [f"{CONTEXT_HEADER}: {context}", ""]
    for s, t in history:
        lines += [f"{src}: {s}", f"{tgt}: {t}"]
    if history:
        lines.append("")
    lines += [f"{src}: {source}", f"{tgt}:"]
    return "\n".join(lines), examples_end


@dataclass(frozen=True)
class PromptPreparer:
    """A draft's prompt, built and tokenised, within an engine's positions: the host work of a
    draft that needs no engine state. It pickles (the tokenizer with it), so an engine in a child
    process hands it to its parent once, and the parent's threads prepare every draft."""

    tokenizer: Any
    max_positions: int

    def __call__(self, request: DraftRequest) -> PromptLayout:
        prompt = build_prompt(self.tokenizer, request)
        if len(prompt.input_ids) + request.max_new_tokens > self.max_positions:
            raise AlignattError(f"prompt of {len(prompt.input_ids)} tokens + {request.max_new_tokens} new tokens "
                                f"exceeds max_model_len={self.max_positions}")
        return prompt
