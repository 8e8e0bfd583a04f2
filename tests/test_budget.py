"""Token bounds (serve.budget): counted with the seam's own tokenizer and prompt, capped by positions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alignatt.core.draft import DraftRequest, Head
from alignatt.core.prompt import build_prompt
from alignatt.serve.budget import PromptBudget, seam_positions
from alignatt.serve.session import BudgetExceeded, SessionLimits
from tests.mt_fakes import FakeSeam

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


@settings(max_examples=60, deadline=None)
@given(source=words, prefix=st.text(max_size=40))
def test_the_cheap_byte_bound_is_never_below_the_exact_count(hf_seam, source, prefix):
    budget = PromptBudget.for_seam(hf_seam, SessionLimits(), draft_tokens=16)
    request = DraftRequest(source_words=source, committed_words=len(source), target_prefix=prefix)
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
