"""Token bounds (serve.budget): counted with the seam's own tokenizer and prompt, capped by positions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alignatt.core.draft import DraftRequest, Head
from alignatt.core.prompt import build_prompt
from alignatt.serve.budget import PromptBudget, seam_positions
from alignatt.serve.session import BudgetExceeded, SessionLimits
from tests.fakes.mt_fakes import FakeSeam

words = st.lists(st.text(st.characters(codec="utf-8", exclude_categories=("Z", "Cc", "Cs")), min_size=1, max_size=12),
                 min_size=1, max_size=20)


@pytest.fixture(scope="module")
def hf_seam(tiny_gemma4):
    from alignatt.capture.hf.qk_fast import HFQKFastSeam

    return HFQKFastSeam(tiny_gemma4, [Head(4, 0)])


def test_the_bounds_of_a_transformers_seam_come_from_its_model(hf_seam):
    positions = hf_seam.loaded.model.config.get_text_config().max_position_embeddings
    assert seam_positions(hf_seam) == positions
    budget = PromptBudget.for_seam(hf_seam, SessionLimits(max_prompt_tokens=10**6), draft_tokens=256)
    assert budget.max_prompt_tokens == positions - 256
    assert PromptBudget.for_seam(hf_seam, SessionLimits(), 256).max_prompt_tokens == min(2048, positions - 256)


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@settings(max_examples=80, deadline=None)
@given(source=words, prefix=st.text(max_size=40), context=st.one_of(st.just(""), texts),
       history=st.lists(st.tuples(texts, texts), max_size=3), target=st.sampled_from(["de", "it", "zh", "cs", "xx"]))
def test_the_cheap_byte_bound_is_never_below_the_exact_count(hf_seam, source, prefix, context, history, target):
    budget = PromptBudget.for_seam(hf_seam, SessionLimits(), draft_tokens=16)
    request = DraftRequest(source_words=source, committed_words=len(source), target_prefix=prefix,
                           context_text=context, history=history, target_lang=target)
    try:
        exact = len(build_prompt(hf_seam.loaded.tokenizer, request).input_ids)
    except Exception:  # words the prompt builder refuses are refused by the draft too
        return
    assert budget._prompt_upper_bound(request) >= exact
    assert budget.prompt_tokens(request) == exact


def test_an_exact_count_decides_past_the_cheap_bound(hf_seam):
    tok = hf_seam.loaded.tokenizer
    small = DraftRequest(source_words=["hello"] * 50, committed_words=50)
    exact = len(build_prompt(tok, small).input_ids)
    fits = PromptBudget.for_seam(hf_seam, SessionLimits(max_prompt_tokens=exact), draft_tokens=1)
    fits.check_request(small)  # at the bound: fine
    over = PromptBudget.for_seam(hf_seam, SessionLimits(max_prompt_tokens=exact - 1), draft_tokens=1)
    with pytest.raises(BudgetExceeded, match=f"prompt of {exact} tokens exceeds max_prompt_tokens={exact - 1}"):
        over.check_request(small)
    with pytest.raises(BudgetExceeded, match="max_target_prefix_tokens=20"):
        PromptBudget.for_seam(hf_seam, SessionLimits(max_target_prefix_tokens=20), 1).check_prefix("Wort " * 30)


# ---- the whole prompt: template, context_text, history, source and prefix ----

DIGITS_CONTEXT = "1" * 2000  # the reproduction: digits are one token each
DIGITS_HISTORY = [("2" * 1000, "3" * 1000)]


def test_context_and_history_count_in_the_prompt_bound(hf_seam):
    budget = PromptBudget.for_seam(hf_seam, SessionLimits(), draft_tokens=256)
    short = DraftRequest(source_words="the model reads each block once".split(), committed_words=6)
    budget.check_request(short)  # a short prompt: within the bound, counted cheaply
    whole = DraftRequest(source_words=short.source_words, committed_words=6, context_text=DIGITS_CONTEXT,
                         history=DIGITS_HISTORY)
    n = len(build_prompt(hf_seam.loaded.tokenizer, whole).input_ids)
    assert n > budget.max_prompt_tokens  # 4 000 digits and the template
    with pytest.raises(BudgetExceeded, match=f"prompt of {n} tokens exceeds max_prompt_tokens={budget.max_prompt_tokens}"):
        budget.check_request(whole)
    with pytest.raises(BudgetExceeded, match=f"max_prompt_tokens={budget.max_prompt_tokens}"):
        budget.check_init("", DIGITS_HISTORY, DIGITS_CONTEXT, "en", "de")
    budget.check_init("Das", [("a b", "c d")], "Names: Kowalczyk.", "en", "de")  # a modest init fits


def test_history_the_session_grew_is_trimmed_oldest_first_to_fit(hf_seam):
    tok = hf_seam.loaded.tokenizer
    turns = [(f"{i}" * 300, f"{i}" * 300) for i in range(1, 4)]  # about 600 tokens a turn
    request = DraftRequest(source_words=["hello"], committed_words=1, history=turns)
    full = len(build_prompt(tok, request).input_ids)
    budget = PromptBudget.for_seam(hf_seam, SessionLimits(max_prompt_tokens=full - 100), draft_tokens=1)
    fitted = budget.fit(request)
    assert fitted.history == turns[1:]  # the oldest turn left out, the newest kept
    assert len(build_prompt(tok, fitted).input_ids) <= budget.max_prompt_tokens
    assert budget.fit(fitted) is fitted  # within the bound: unchanged
    tight = PromptBudget.for_seam(hf_seam, SessionLimits(max_prompt_tokens=16), draft_tokens=1)
    with pytest.raises(BudgetExceeded, match="max_prompt_tokens=16"):  # over even without history
        tight.fit(DraftRequest(source_words=["hello"] * 40, committed_words=40, history=turns))


def stand_in_vllm_seam(tokenizer, max_model_len: int):
    from alignatt.capture.vllm.engine import VllmEngineConfig
    from alignatt.capture.vllm.seam import VllmCaptureSeam

    seam = object.__new__(VllmCaptureSeam)  # the class's own properties, without starting vLLM
    seam.config = VllmEngineConfig(model="gemma4-e4b-synthetic", max_model_len=max_model_len)
    seam.tokenizer = tokenizer
    return seam


def test_the_vllm_seams_positions_are_its_engines_max_model_len(tiny_gemma4):
    seam = stand_in_vllm_seam(tiny_gemma4.tokenizer, max_model_len=1024)
    assert seam_positions(seam) == 1024
    budget = PromptBudget.for_seam(seam, SessionLimits(), draft_tokens=256)
    assert budget.describe() == {"positions": 1024, "max_prompt_tokens": 1024 - 256,
                                 "max_target_prefix_tokens": 1024 - 256, "max_context_tokens": 4096}
    with pytest.raises(BudgetExceeded, match="max_prompt_tokens=768.*the model takes 1024 positions"):
        budget.check_request(DraftRequest(source_words=[f"w{i}" + "q" * 20 for i in range(200)], committed_words=200))


def test_a_seam_that_counts_itself_is_asked():
    seam = FakeSeam(max_positions=100)
    budget = PromptBudget.for_seam(seam, SessionLimits(), draft_tokens=60)
    assert budget.positions == 100 and budget.max_prompt_tokens == 40 and budget.max_target_prefix_tokens == 40
    with pytest.raises(BudgetExceeded, match="max_prompt_tokens=40"):
        budget.check_request(DraftRequest(source_words=["w"] * 36, committed_words=36))
    budget.check_request(DraftRequest(source_words=["w"] * 35, committed_words=35))


def test_a_seam_without_a_tokenizer_has_no_token_bounds():
    class Bare:
        name = "bare"

    assert PromptBudget.for_seam(Bare(), SessionLimits(), 16) is None


@pytest.mark.slow
def test_the_embedded_models_count_is_the_drafts_prompt(gemma3_270m):
    from alignatt.capture.hf.qk_fast import HFQKFastSeam
    from alignatt.heads.sets import default_heads

    seam = HFQKFastSeam(gemma3_270m, default_heads("gemma3-270m", 2, "en-de"))
    budget = PromptBudget.for_seam(seam, SessionLimits(), draft_tokens=256)
    assert budget.positions == gemma3_270m.model.config.get_text_config().max_position_embeddings
    request = DraftRequest(source_words="the model reads each block once".split(), committed_words=4,
                           target_prefix="Das Modell", max_new_tokens=2)
    assert budget.prompt_tokens(request) == seam.draft(request).prompt_token_count
    with pytest.raises(BudgetExceeded, match="max_prompt_tokens=2048"):
        budget.check_request(DraftRequest(source_words=[f"w{i}" + "q" * 150 for i in range(300)], committed_words=300))


@pytest.mark.gpu
@pytest.mark.parametrize("seam_name", ["vllm_capture", "hf_qk_fast"])
def test_e4b_bounds_on_the_gpu(seam_name):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if seam_name == "vllm_capture":
        pytest.importorskip("vllm")
    from alignatt.capture.registry import make_seam
    from alignatt.heads.sets import default_heads

    seam = make_seam(seam_name, model="gemma4-e4b-synthetic", heads=default_heads("gemma4-e4b-synthetic", 4, "en-de"),
                     device="cuda")
    try:
        budget = PromptBudget.for_seam(seam, SessionLimits(), draft_tokens=256)
        print(seam_name, budget.describe())
        assert budget is not None and budget.positions and budget.max_prompt_tokens <= budget.positions - 256
        request = DraftRequest(source_words="the model reads each block once".split(), committed_words=4,
                               target_prefix="Das Modell", max_new_tokens=2)
        assert budget.prompt_tokens(request) == seam.draft(request).prompt_token_count
        with pytest.raises(BudgetExceeded, match="max_prompt_tokens"):
            budget.check_request(DraftRequest(source_words=[f"w{i}" + "q" * 150 for i in range(300)],
                                              committed_words=300))
    finally:
        seam.close()
