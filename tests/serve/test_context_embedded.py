"""Context and history on the embedded Gemma-3-270M: the guard, a glossary name, a reconnect.

The embedded base model translates "Thank you, doctor." as "Danke, Arzt."; with the background
line "Names: Dr. Kowalczyk." in its prompt it writes "Danke, Herr Kowalczyk.", and the name's
tokens draw most of their content attention from the context block (share ~0.7-0.95, against
~0.1-0.2 for the other tokens), so the guard holds them in partials and the final emits them.
"""

import pytest

from alignatt.core.policy import CONTEXT_LEAK, PolicyConfig
from alignatt.serve.session import Session, SessionConfig

pytestmark = pytest.mark.slow

CONTEXT = "Names: Dr. Kowalczyk."
SOURCE = "Thank you, doctor.".split()


@pytest.fixture(scope="module")
def seam(gemma3_270m):
    from alignatt.capture.registry import make_seam
    from alignatt.heads.sets import default_heads

    s = make_seam("hf_qk_fast", model="gemma3-270m", heads=default_heads("gemma3-270m", 4), device="cpu")
    yield s
    s.close()


def session(seam, context="", history=None, prefix=""):
    cfg = SessionConfig(policy=PolicyConfig(border_words=0), max_new_tokens=10, final_extra_tokens=6)
    return Session(seam, cfg, source_lang="en", target_lang="de", context_text=context,
                   history=history, accepted_target_prefix=prefix)


def test_guard_holds_the_context_name_and_the_final_brings_it(seam):
    s = session(seam, CONTEXT)
    step = s.update(SOURCE, [], is_final=False, utterance_id=0)
    assert step.stop_reason == "alignatt:" + CONTEXT_LEAK, step.policy.as_dict()
    leak = next(d for d in step.policy.decisions if d.reason == CONTEXT_LEAK)
    assert leak.mass["context_share"] > 0.5 and "Kow" in leak.piece + step.buffer_text
    assert "Kowalczyk" not in step.committed_text  # held: it is read off the glossary, not the speech
    final = s.update(SOURCE, [], is_final=True, utterance_id=0)
    assert "Kowalczyk" in final.committed_text and final.committed_text.startswith(step.committed_text)


def test_the_context_name_reaches_the_translation_only_when_in_context(seam):
    without = session(seam).update(SOURCE, [], is_final=True, utterance_id=0)
    assert "Kowalczyk" not in without.committed_text
    assert all(d.mass["context"] == 0.0 for d in without.policy.decisions)  # no block, no mass


def test_history_semantics_survive_a_reconnect(seam):
    """A client that reconnects sends its history (last finals) and its accepted prefix: the new
    session drafts from the very same prompt as the session it replaces."""
    first = "Good morning.".split()
    second = "The house is small and old.".split()
    a = session(seam, CONTEXT)
    a.update(first, [], is_final=True, utterance_id=0)
    shown = a.update(second[:3], second[3:4], is_final=False, utterance_id=1).committed_text
    history = [[src, tgt] for src, tgt in a.history]  # what WhisperLiveKit keeps (source, final text)
    step_a = a.update(second[:4], second[4:6], is_final=False, utterance_id=1)

    b = session(seam, CONTEXT, history=history, prefix=shown)
    step_b = b.update(second[:4], second[4:6], is_final=False, utterance_id=1)
    ra, rb = a.last_draft.request, b.last_draft.request
    assert rb.history == ra.history and len(ra.history) == 1 and ra.history[0][0] == "Good morning."
    assert rb.target_prefix == ra.target_prefix == shown
    assert b.last_draft.text == a.last_draft.text
    assert step_b.committed_text == step_a.committed_text
