"""`vllm_capture`: alignment-head rows from vLLM's own q and KV cache, correct under CUDA graphs.

How (see docs/cudagraph-capture.md for why):
- Before the engine captures any graph, the `Attention` module of every selected layer gets a
  subclass whose forward first calls a registered custom op, `alignatt::qcache_write`, on the
  post-RoPE query. The op writes the selected heads into a `QueryCache` (alignatt.capture.vllm.qcache) at the
  step's `slot_mapping` entry of that layer (a KV-shared layer uses its donor's entry), i.e. at
  the same index the KV-cache write uses; pad rows carry slot -1 and go to a dump row. The
  buffers are allocated right after vLLM allocates its KV cache, before capture, and never move.
  That engine side lives in `alignatt.capture.vllm.hooks`; this module is the seam that drives it.
- After a request finishes, its drafted tokens' q rows are read by the request's block table,
  its keys are read from the KV cache (a KV-shared layer reads its donor's cache) and the rows are
  rebuilt with fp32 softmax over every visible position (sliding window on sliding layers): for
  all requests that finished in a step at once, queued without waiting on the device and read
  after the next step is queued behind it.

Modes: `eager` (enforce_eager), `cudagraph` (full decode CUDA graphs, no torch.compile: the
bit-exact scored mode), `fullgraph` (full graphs for every step: the served mode) and `compiled`
(torch.compile under fullgraph's graphs); `quantization="fp8"` runs any of them on FP8 weights.
Everything vLLM-specific is imported lazily: this module imports on a CPU machine without vLLM.

Synthetic weights (`gemma4-e4b-synthetic`): vLLM's dummy loader makes Gemma-4's activations
vanish with depth, so right after the model loads (before the KV cache and any graph) the
weights are rewritten in place the way transformers initialises a fresh Gemma-4
(alignatt.models.synthetic_init); `describe()` records it.

Parts: `engine` (config and start), `fetch` (typed per-request state, the batched fetch +
rebuild), `hooks` (the engine side), `settling` (drafts that leave the engine once their answer is
known); this module composes them.

Pinned against vLLM 0.22.1 (V1 GPU model runner, in-process engine, TRITON_ATTN KV layout
[num_blocks, 2, block_size, num_kv_heads, head_size]); every internal it touches is checked at
engine start and a mismatch raises naming what differed.
"""

import gc
import time
from typing import Any, Optional, Sequence

import torch
from pydantic import ValidationError
from torch.profiler import record_function

from alignatt.capture.names import FETCH_RANGE
from alignatt.capture.vllm.engine import (  # noqa: F401  (VLLM_MODES, engine_options: the mode names' home)
    VLLM_MODES,
    StartedEngine,
    VllmEngineConfig,
    check_runtime,
    engine_options,
    load_tokenizer,
    resolve_model,
    start_engine,
)
from alignatt.capture.vllm.fetch import BatchFetcher, DraftState, EngineView, FetchItem, RawCapture
from alignatt.capture.vllm.hooks import log
from alignatt.capture.vllm.qcache import head_order, plan_capture
from alignatt.capture.vllm import verify as vllm_verify
from alignatt.capture.vllm.drafts import FinishedStep, draft_of, engine_timings, trimmed
from alignatt.capture.vllm.settling import SETTLE_PHASES, Settler
from alignatt.core.draft import Draft, DraftRequest, Head, add_acceptance
from alignatt.core.errors import AlignattError
from alignatt.core.layout import AttentionLayout
from alignatt.core.prompt import PrefixCacheCounts, PromptLayout, PromptPreparer
from alignatt.models.synthetic_init import HFLikeInit

CAPTURED_FAMILIES = ("gemma4_text", "gemma3_text")  # vLLM's Gemma4Attention and Gemma3Attention
# The parts of VllmCaptureSeam.step, timed: vLLM's own step, the settle checks' parts (settling.py),
# trimming the finished requests, the one fetch of the step's checks and finished requests (its host
# indices built and sent, then its kernels and copy-back queued), and building the drafts whose rows
# came back.
STEP_PHASES = ("vllm", *SETTLE_PHASES, "finish", "fetch_pack", "fetch_queue", "drafts")


def _engine_config(model: str, options: dict) -> VllmEngineConfig:
    try:
        return VllmEngineConfig(model=model, **{k: v for k, v in options.items() if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise AlignattError(f"bad vllm_capture option {where}: {first['msg']}") from None


def draft_sampling(max_new_tokens: int, fixed_length: bool, stop_ids: set[int]) -> dict[str, Any]:
    """`SamplingParams` fields of one draft: greedy, no detokenising, every object its own.

    `skip_clone`: vLLM's input processor deep-copies a request's params unless told that they are
    the request's alone. These are built for one request and never reused, and the deep copy (about
    107 `deepcopy` calls a request) took 0.5 ms of every submit in the engine at 128 speakers on
    the H200 (cProfile, 2026-12-03)."""
    return dict(temperature=0.0, max_tokens=max_new_tokens, min_tokens=max_new_tokens if fixed_length else 0,
                ignore_eos=fixed_length, stop_token_ids=None if fixed_length else sorted(stop_ids),
                detokenize=False, skip_clone=True)


class VllmCaptureSeam:
    """Greedy drafts from an in-process vLLM engine with slot-addressed q capture.

    Batch interface (what the server's scheduler drives): `submit` a request, `step` the engine
    (new requests join the running batch at the next step; vLLM's scheduler does the batching),
    `abort` a request that is no longer wanted. `draft` / `draft_many` run to completion.
    """

    name = "vllm_capture"
    book: Optional[vllm_verify.ProposalBook] = None  # verification's proposals (None: verify off)

    def __init__(self, model: str, heads: list[Head], tokenizer: Any = None, *, fixed_length: bool = False,
                 reconstruct: str = "batched", keep_raw: bool = False, **engine: Any) -> None:
        self.config = _engine_config(model, engine)
        if reconstruct not in ("batched", "reference"):
            raise AlignattError(f"reconstruct must be 'batched' or 'reference', not {reconstruct!r}")
        check_runtime()
        from transformers import AutoConfig

        from alignatt.models.presets import eos_and_turn_ids

        self.fixed_length, self.reconstruct, self.keep_raw = fixed_length, reconstruct, keep_raw
        self.spec = resolve_model(model)
        self.tokenizer = load_tokenizer(self.spec, tokenizer)
        # `prepare` as a picklable object: an engine in a child process hands it to its parent.
        self.preparer = PromptPreparer(self.tokenizer, self.config.max_model_len)
        hf_config = AutoConfig.from_pretrained(self.spec.config_dir, local_files_only=True)
        self.layout = AttentionLayout.from_config(hf_config)
        if self.layout.family not in CAPTURED_FAMILIES:
            raise AlignattError(f"vllm_capture runs {' and '.join(CAPTURED_FAMILIES)}; {model} is {self.layout.family}")
        self.heads = self.layout.validate_heads(heads)
        self.plans = plan_capture(self.layout, self.heads)
        text_config = hf_config.get_text_config()
        self.stop_ids = set(eos_and_turn_ids([text_config], self.tokenizer))
        self._newline_ids = {i for t, i in self.tokenizer.get_vocab().items() if "\n" in t or "Ċ" in t}
        # Synthetic weights: the dummy loader's are degenerate for Gemma-4 (see synthetic_init).
        self.synthetic_init = (
            HFLikeInit(std=float(getattr(text_config, "initializer_range", None) or 0.02), seed=self.config.seed)
            if self.spec.synthetic else None
        )
        log(f"heads {[(h.layer, h.head) for h in self.heads]}")
        self.engine: Optional[StartedEngine] = start_engine(
            self.config, self.spec, self.plans if self.config.capture else None, self.synthetic_init,
            getattr(text_config, "pad_token_id", None))
        self.fetcher = (BatchFetcher(EngineView.from_hooks(self.engine.hooks), self.plans,
                                     head_order(self.plans, self.heads), self.config.capture_output, keep_raw)
                        if self.config.capture else None)
        self.raw: dict[str, RawCapture] = {}
        self.last_raw_id: Optional[str] = None
        self._states: dict[str, DraftState] = {}
        # Fetches queued in the last step, read after the next step is queued behind them.
        self._pending: list[FinishedStep] = []
        self._aborted: set[str] = set()
        self._counter = 0
        self._warned: set[str] = set()
        self.prefix_cache = PrefixCacheCounts()  # over the finished drafts
        # Verified re-drafts (docs/batching.md): off leaves the engine without a speculative config.
        # Drafts with a settle rule leave the engine once their rows hold the answer (settling.py).
        self.step_phases_s = dict.fromkeys(STEP_PHASES, 0.0)
        # Tokens the steps computed (uncached prompt tokens, decoded tokens): a profile's FLOP count.
        self.step_token_counts = {"prefill": 0, "decode": 0}
        self.settler = Settler(self.fetcher, self.config.settle_every, self.step_phases_s)
        if self.config.verify:
            self.book = vllm_verify.ProposalBook(self.config.verify_tokens)
            vllm_verify.install(self._runner(), self.book)
        self.totals: dict[str, float] = {}
        self._scopes_before: Optional[tuple] = None  # vLLM's scope function while host_scopes is on

    def _runner(self) -> Any:
        hooks = self.engine.hooks
        if hooks is not None and hooks.runner is not None:
            return hooks.runner
        return self.engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner

    def weight_bytes(self) -> dict:
        """Bytes of the model's weights on the device, and of those one forward streams (all but
        per-layer embedding tables, of which a forward gathers a few rows), with the parameters a
        token multiplies by (the streamed ones): a kernel profile's roofline."""
        total = streamed = params = 0
        for name, p in self._runner().get_model().named_parameters():
            size = p.numel() * p.element_size()
            total += size
            if "per_layer" in name and "embed" in name:
                continue
            streamed += size
            params += p.numel()
        return {"total": total, "streamed": streamed, "active_params": params}

    def host_scopes(self, on: bool) -> None:
        """vLLM's own host ranges (schedule, model-runner phases) in a kernel profile, on or off.

        vLLM picks its scope function once per process (VLLM_CUSTOM_SCOPES_FOR_PROFILING) and keeps it
        in `vllm.v1.utils._PROFILER_FUNC`, which every scope reads; setting it only while a window
        runs keeps the scopes' cost (a record_function per request per step) out of other steps."""
        import vllm.v1.utils as vllm_utils
        from torch.profiler import record_function

        if not hasattr(vllm_utils, "_PROFILER_FUNC"):
            raise AlignattError("vllm.v1.utils._PROFILER_FUNC is gone: vLLM's host scopes cannot be switched")
        if on and self._scopes_before is None:
            self._scopes_before = (vllm_utils._PROFILER_FUNC,)  # None too: vLLM picks again from its env
            vllm_utils._PROFILER_FUNC = record_function
        elif not on and self._scopes_before is not None:
            (vllm_utils._PROFILER_FUNC,), self._scopes_before = self._scopes_before, None

    def acceptance_totals(self) -> dict:
        """Verification figures summed over finished drafts (the load benchmark takes differences)."""
        return dict(getattr(self, "totals", {}))

    # ---- compatibility views (checks and describe read these) ----

    @property
    def capture(self) -> bool:
        return self.config.capture

    @property
    def capture_output(self) -> bool:
        return self.config.capture_output

    @property
    def max_batch(self) -> int:
        return self.config.max_num_seqs

    @property
    def max_positions(self) -> int:
        """Positions a prompt and its draft may take together: the engine's `max_model_len` (what
        the server's token budget is capped by, so an over-long prompt is refused at admission)."""
        return self.config.max_model_len

    # ---- the batch interface ----

    def prepare(self, request: DraftRequest) -> PromptLayout:
        """The draft's prompt, built and tokenised: no engine state is touched, so a scheduler
        calls this on the submitting thread (a profile of 128 streams on the H200 found prompt
        building and tokenising at ~39 % of the engine thread's busy samples)."""
        return self.preparer(request)

    def submit(self, request: DraftRequest, prompt=None) -> str:
        """Queue one draft in the engine (its `prepare`d prompt, else prepared here); it joins the
        running batch at the next `step`."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        prompt = prompt if prompt is not None else self.prepare(request)
        self._counter += 1
        handle = f"alignatt-{self._counter}"
        params = SamplingParams(**draft_sampling(request.max_new_tokens, self.fixed_length,
                                                 self.stop_ids | (self._newline_ids if prompt.stop_at_newline else set())),
                                output_kind=RequestOutputKind.DELTA)
        now = time.perf_counter()
        internal = self.engine.core.add_request(handle, self._engine_prompt(prompt.input_ids), params)
        state = DraftState(handle, internal if isinstance(internal, str) else handle, request, prompt, now)
        if self.book is not None:
            state.proposal = tuple(request.proposed_tokens())
            self.book.add(state.internal, len(prompt.input_ids), state.proposal)
        state.check_at = self.settler.first_check(request, self.fixed_length)
        self._states[handle] = state
        return handle

    def abort(self, handle: str) -> None:
        """Drop a queued or running request (a newer update superseded it)."""
        state = self._states.pop(handle, None)
        if state is None:
            for done in self._pending:  # finished, its rows still on their way: drop the draft
                done.dropped.add(handle)
            return
        self.engine.core.abort_request([handle])
        self._aborted.add(handle)
        if self.book is not None:
            self.book.drop(state.internal)
        if self.engine.hooks is not None:
            self.engine.hooks.block_ids.pop(state.internal, None)

    def has_unfinished(self) -> bool:
        return bool(self._states or self._pending)

    def step(self) -> list[tuple[str, Draft]]:
        """One engine step; the drafts whose rows are ready.

        The rows of the requests that finished in a step are queued at once (before the next step
        can reuse their blocks) and read one step later, when the next forward is already queued
        behind them: the GPU never idles for the copy. With nothing left running there is no next
        step to overlap, and they are read at once."""
        started = time.perf_counter()
        running = bool(self._states) or self.engine.core.has_unfinished_requests()
        outputs = self.engine.core.step() if running else []
        now = time.perf_counter()
        finished: list[DraftState] = []
        for out in outputs:
            state = self._states.get(out.request_id)
            if state is None:
                if out.request_id in self._aborted:
                    continue
                raise RuntimeError(f"alignatt: output for unknown request {out.request_id}")
            if state.cached_tokens is None and getattr(out, "num_cached_tokens", None) is not None:
                state.cached_tokens = int(out.num_cached_tokens)
            new = len(out.outputs[0].token_ids)
            if state.tokens:
                self.step_token_counts["decode"] += new
            elif new:  # its prefill step (its first token is sampled there)
                self.step_token_counts["prefill"] += len(state.prompt.input_ids) - (state.cached_tokens or 0)
            state.tokens.extend(out.outputs[0].token_ids)
            state.step_tokens.append(new)
            if state.first_token_at is None and state.tokens:
                state.first_token_at = now
            if out.finished:
                state.finished_at, state.finish_reason = now, out.outputs[0].finish_reason
                finished.append(self._states.pop(out.request_id))
                if self.book is not None:
                    self.book.drop(state.internal)
        if len(self._aborted) > 10_000:
            self._aborted.clear()  # late outputs of aborted requests arrive within a step or two
        stopped, due = self.settler.step(self._states, now, self._leave_engine)
        finished += stopped
        settled = time.perf_counter()
        ready, self._pending = self._pending, []
        done = self._start_finish(finished) if finished else None
        finish_ended = time.perf_counter()
        pack_s = self._queue_fetch(due, done)
        if done is not None:
            if self._states and done.fetch is not None:  # rows on their way: read after the next step
                self._pending.append(done)
            else:
                ready.append(done)
        queued_at = time.perf_counter()
        drafts = [pair for d in ready for pair in self._complete(d)]
        phases = self.step_phases_s
        phases["vllm"] += now - started
        phases["finish"] += finish_ended - settled
        phases["fetch_pack"] += pack_s
        phases["fetch_queue"] += queued_at - finish_ended - pack_s  # the rest: items built, kernels queued
        phases["drafts"] += time.perf_counter() - queued_at
        return drafts

    def _queue_fetch(self, due: list[DraftState], done: Optional[FinishedStep]) -> float:
        """One batched fetch for the step's settle checks (their requests still run), first, and its
        finished requests: the host packs the indices once and the kernels are launched once per step.
        Returns the seconds its packing took (0: nothing to fetch)."""
        checks = [self._item(st, len(st.tokens)) for st in due]
        finishes = done.items if done is not None else []
        if not checks and not finishes:
            return 0.0
        with record_function(FETCH_RANGE):  # a kernel profile tells the capture's fetch from the model's kernels
            fetch = self.fetcher.enqueue([*checks, *finishes], running=[True] * len(checks) + [False] * len(finishes))
        self.settler.queued(due, fetch)
        if finishes:
            done.fetch, done.offset = fetch, len(checks)
        return fetch.pack_ms / 1e3

    def _leave_engine(self, states: list[DraftState]) -> None:
        """Settled requests out of vLLM's batch, in one abort; their blocks stay readable until the next step."""
        self.engine.core.abort_request([st.handle for st in states])
        for st in states:
            self._aborted.add(st.handle)  # its in-flight step's output arrives late
            if self.book is not None:
                self.book.drop(st.internal)

    # ---- run to completion ----

    def draft(self, request: DraftRequest) -> Draft:
        return self.draft_many([request])[0]

    def draft_many(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """Draft several requests in one engine batch; each gets its own rows."""
        if self.has_unfinished() or self.engine.core.has_unfinished_requests():
            raise RuntimeError("alignatt: the engine still has unfinished requests")
        torch.cuda.synchronize()
        handles = [self.submit(r) for r in requests]
        t0 = time.perf_counter()
        for h in handles:
            self._states[h].submitted_at = t0
        done: dict[str, Draft] = {}
        while self.has_unfinished():
            done.update(self.step())
        return [done[h] for h in handles]

    def _engine_prompt(self, ids: list[int]) -> Any:
        prompt = {"prompt_token_ids": list(ids)}
        preprocess = getattr(self.engine.llm, "_preprocess_cmpl_one", None)
        if preprocess is None:
            return prompt
        try:
            return preprocess(prompt, None)
        except Exception as e:  # noqa: BLE001 - the raw token prompt is still accepted (deprecated)
            self._warn_once("preprocess", f"LLM._preprocess_cmpl_one failed ({e!r}); passing the raw token prompt")
            return prompt

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log(message)

    def _start_finish(self, states: list[DraftState]) -> FinishedStep:
        """Trim the finished drafts and pick those whose rows are fetched (`_queue_fetch` queues them
        with the step's settle checks); a settled draft whose last check covers it takes those rows."""
        done = FinishedStep(states)
        for st in states:
            done.timings.append(engine_timings(st))
            done.trimmed.append(trimmed(st, self.stop_ids, self._newline_ids, self.fixed_length))
            self.prefix_cache.add(st.prompt, st.cached_tokens or 0)
        if self.fetcher is None:
            return done
        for i, (st, (tok, _)) in enumerate(zip(states, done.trimmed)):
            rows = Settler.prefetched(st, len(tok))  # a settled draft's rows from its last check
            if rows is not None:
                done.prefetched[i] = rows
        items = [(i, self._item(st, len(tok))) for i, (st, (tok, _)) in enumerate(zip(states, done.trimmed))
                 if tok and i not in done.prefetched]
        for i, (st, (tok, _)) in enumerate(zip(states, done.trimmed)):
            if not tok or i in done.prefetched:
                self.engine.hooks.block_ids.pop(st.internal, None)
        if not items:
            return done
        done.fetched_index = [i for i, _ in items]
        if self.reconstruct == "reference":
            done.reference = [self.fetcher.fetch_one(it, method="reference") for _, it in items]
        else:
            done.items = [it for _, it in items]  # queued by `_queue_fetch`, with the step's checks
        return done

    def _complete(self, done: FinishedStep) -> list[tuple[str, Draft]]:
        """The drafts of one finished step, once its rows are on the host."""
        fetched: dict[int, Any] = {}
        if done.fetch is not None:
            ft = done.fetch.timings()
            fetched = {i: (done.fetch.row(done.offset + k), ft) for k, i in enumerate(done.fetched_index)}
        elif done.reference is not None:
            fetched = dict(zip(done.fetched_index, done.reference))
        fetched.update(done.prefetched)
        out = []
        for i, (st, (tokens, stop_reason)) in enumerate(zip(done.states, done.trimmed)):
            if st.handle in done.dropped:
                continue
            timings = done.timings[i]
            acceptance = vllm_verify.acceptance_of(tokens, st.proposal, st.step_tokens, timings.prefill_ms,
                                                   timings.decode_ms)
            add_acceptance(self.__dict__.setdefault("totals", {}), acceptance, len(tokens))
            got = None
            if i in fetched:
                got, ft = fetched[i]
                timings.capture_ms, timings.reconstruct_ms = ft.capture_ms, ft.reconstruct_ms
                if got.raw is not None:
                    self.raw[st.internal] = got.raw
                    self.last_raw_id = st.internal
            out.append((st.handle, draft_of(st, tokens, stop_reason, got, timings, acceptance, self.tokenizer,
                                            list(self.heads) if self.capture else [], self.name)))
        return out

    def _item(self, st: DraftState, n_tokens: int) -> FetchItem:
        n_prompt = len(st.prompt.input_ids)
        window = min((p.sliding_window for p in self.plans.values() if p.sliding_window), default=None)
        if window and n_prompt + n_tokens > window + 16:
            # vLLM frees sliding-window blocks that fall out of the newest token's window; the
            # early drafted tokens' keys then live in freed blocks, which only another running
            # request could overwrite before this read.
            self._warn_once("window", f"note: prompt + draft ({n_prompt + n_tokens}) exceeds the sliding window "
                            f"({window}); rows of early tokens read keys from blocks vLLM already freed")
        source, context, history, _ = st.prompt_arrays()
        return FetchItem(st.internal, n_prompt, n_tokens, source, st.prompt.prefix_start, context, history)

    def describe(self) -> dict:
        """Facts for artifacts and logs."""
        e = self.engine
        hooks = e.hooks if e else None
        report = (e.synthetic_init_report if e else None) or {}
        return {
            "seam": self.name,
            "vllm_mode": self.config.vllm_mode,
            "model": self.spec.name,
            "synthetic_weights": self.spec.synthetic,
            "synthetic_init": self.synthetic_init.describe() if self.synthetic_init else None,
            "synthetic_init_tensors": report.get("tensors"),
            "synthetic_init_unknown": report.get("unknown"),
            "dtype": self.config.dtype,
            "kv_cache_memory_gib": self.config.kv_cache_memory_gib,
            "max_num_seqs": self.config.max_num_seqs,
            "enable_prefix_caching": self.config.enable_prefix_caching,
            "batch_invariant": self.config.batch_invariant,
            "quantization": self.config.quantization,
            "verify": self.config.verify,
            "verify_tokens": self.config.verify_tokens if self.config.verify else None,
            "settle_every": self.config.settle_every,  # used by requests with a settle rule only
            "heads": [[h.layer, h.head] for h in self.heads],
            # the backend vLLM runs the captured layers with (the capture reads its KV cache layout)
            "attention_backend": sorted({a.attn_backend.get_name() for a in hooks.attn.values()}) if hooks else None,
            "capture": self.capture,
            "reconstruct": self.reconstruct,
            "engine_start_s": round(e.start_s, 2) if e else None,
            "options": engine_options(self.config.vllm_mode),
            **self.prefix_cache.describe(),  # uncached prompt tokens by region (core/prompt.py)
            "kv_cache_tokens": self.fetcher.view.kv_cache_tokens() if self.fetcher is not None else None,
            "query_cache_mib": round(sum(c.nbytes() for c in hooks.caches.values()) / 2**20, 1) if hooks else 0,
            "keep_alive_add": bool(hooks.keep_alive) if hooks else False,
        }

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        gc.collect()
        torch.cuda.empty_cache()


def make_seam(model: str, heads: list[Head], device: str = "cuda", dtype: Optional[str] = None,
              vllm_mode: str = "cudagraph", **options: Any) -> VllmCaptureSeam:
    return VllmCaptureSeam(model, heads, vllm_mode=vllm_mode, dtype=dtype, device=device, **options)
