"""Why a naive capture breaks under CUDA-graph replay, shown on any device.

`CpuReplayGraph` is a CPU stand-in for `torch.cuda.CUDAGraph` with the same contract: capture
runs the function once and records every tensor op with the tensors it touched; replay re-runs
only those ops, each writing into the very tensor it produced at capture time (fixed addresses,
memory reused), and none of the Python around them. So a hook that appends to a list appends once,
a tensor allocated inside the captured function is overwritten by every replay, and a branch
taken at capture time is taken forever.

`naive_vs_fixed` plays a padded decode batch through three captures, eagerly and replayed:
- `naive_list`: append the selected heads' q to a Python list (the published bug class);
- `naive_position_scatter`: scatter into a buffer keyed by token position, trusting every batch
  row (pad rows carry stale positions and overwrite real rows; requests collide);
- `fixed`: `QueryCache.write`, addressed by the step's slot mapping with pad slots dumped.
Eagerly the naive list is right; replayed it is not. The fixed capture is right in both.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from alignatt.capture.vllm.qcache import QueryCache


class _Recorder(TorchDispatchMode):
    def __init__(self, tape: list) -> None:
        super().__init__()
        self.tape = tape

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.tape.append((func, args, kwargs, out))
        return out


class CpuReplayGraph:
    """Record-once, replay-tensor-ops-only: the semantics of a CUDA graph, on CPU."""

    def __init__(self) -> None:
        self._tape: list[tuple[Any, tuple, dict, Any]] = []

    def capture(self, fn: Callable[[], None]) -> None:
        self._tape.clear()
        with _Recorder(self._tape):
            fn()

    def replay(self) -> None:
        for func, args, kwargs, out in self._tape:
            result = func(*args, **kwargs)
            # A functional op's output lives at the address it got during capture.
            for old, new in zip(_tensors(out), _tensors(result)):
                if old is not new and old.data_ptr() != new.data_ptr():
                    old.copy_(new)


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for t in x if isinstance(t, torch.Tensor)]
    return []


class CudaReplayGraph:
    """The real thing, behind the same two methods."""

    def __init__(self) -> None:
        self._graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], None]) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph, as torch recommends
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(self._graph):
            fn()

    def replay(self) -> None:
        self._graph.replay()


def _decode_script(device: str, steps: int, seed: int = 0) -> dict:
    """A padded decode batch: 3 real requests in 4 rows; each step gives every real row a fresh
    q at a new position and slot; the pad row keeps slot -1 and a stale position 0."""
    g = torch.Generator().manual_seed(seed)
    n_rows, n_real, n_heads, dim = 4, 3, 4, 8
    prompt_lens = [5, 9, 7]
    base_slot = [16, 48, 80]  # each request's first block starts here (block size 16)
    qs, slots, positions = [], [], []
    for s in range(steps):
        qs.append(torch.randn(n_rows, n_heads * dim, generator=g).to(device))
        slot = [base_slot[r] + prompt_lens[r] + s for r in range(n_real)] + [-1]
        pos = [prompt_lens[r] + s for r in range(n_real)] + [0]
        slots.append(torch.tensor(slot, device=device))
        positions.append(torch.tensor(pos, device=device))
    return dict(n_rows=n_rows, n_real=n_real, n_heads=n_heads, dim=dim, heads=[1, 3],
                qs=qs, slots=slots, positions=positions, n_slots=128)


def naive_vs_fixed(device: str = "cpu", steps: int = 5, replay: bool = True) -> dict:
    """Run the three captures over a scripted decode; report what each recovered."""
    sc = _decode_script(device, steps)
    heads = torch.tensor(sc["heads"], device=device)
    n_heads, dim, n_real = sc["n_heads"], sc["dim"], sc["n_real"]
    static_q = torch.zeros_like(sc["qs"][0])
    static_slots = torch.zeros_like(sc["slots"][0])
    static_pos = torch.zeros_like(sc["positions"][0])

    appended: list[torch.Tensor] = []
    by_position = torch.zeros(64, len(sc["heads"]), dim, device=device)
    cache = QueryCache(sc["n_slots"], len(sc["heads"]), dim, torch.float32, device, sc["heads"])

    def naive_list() -> None:
        appended.append(static_q.view(-1, n_heads, dim).index_select(1, heads).clone())

    def naive_position_scatter() -> None:
        by_position.index_copy_(0, static_pos, static_q.view(-1, n_heads, dim).index_select(1, heads))

    def fixed() -> None:
        cache.write(static_q, static_slots)

    def step_all() -> None:
        naive_list()
        naive_position_scatter()
        fixed()

    def load(s: int) -> None:
        static_q.copy_(sc["qs"][s])
        static_slots.copy_(sc["slots"][s])
        static_pos.copy_(sc["positions"][s])

    if replay:
        graph = CudaReplayGraph() if device.startswith("cuda") else CpuReplayGraph()
        load(0)
        graph.capture(step_all)  # capture-time writes land in slots of step 0: rewritten below
        for s in range(steps):
            load(s)
            graph.replay()
    else:
        for s in range(steps):
            load(s)
            step_all()
    if device.startswith("cuda"):
        torch.cuda.synchronize()

    # Ground truth: every real (step, row) and its expected q rows.
    expected = [
        (s, r, sc["qs"][s].view(-1, n_heads, dim)[r].index_select(0, heads))
        for s in range(steps) for r in range(n_real)
    ]
    n_expected = len(expected)

    # naive list: entry s should hold step s's batch (a warm-up or capture append counts too).
    list_ok, list_err = 0, 0.0
    for s, r, want in expected:
        if s < len(appended):
            err = float((appended[s][r] - want).abs().max())
            list_err = max(list_err, err)
            list_ok += int(err == 0.0)

    # position scatter: request r's step s row should sit at its position.
    pos_ok, pos_err = 0, 0.0
    for s, r, want in expected:
        got = by_position[int(sc["positions"][s][r])]
        err = float((got - want).abs().max())
        pos_err = max(pos_err, err)
        pos_ok += int(err == 0.0)

    fixed_ok, fixed_err = 0, 0.0
    for s, r, want in expected:
        got = cache.read(sc["slots"][s][r : r + 1])[0]
        err = float((got - want).abs().max())
        fixed_err = max(fixed_err, err)
        fixed_ok += int(err == 0.0)
    real_slots = {int(sl[r]) for sl in sc["slots"] for r in range(n_real)}
    untouched = [i for i in range(sc["n_slots"]) if i not in real_slots]
    stray = float(cache.q[untouched].abs().max()) if untouched else 0.0

    return {
        "device": device,
        "replayed": replay,
        "steps": steps,
        "rows_expected": n_expected,
        "naive_list": {"entries": len(appended), "rows_correct": list_ok, "max_abs_err": list_err,
                       "last_entry_holds_last_step": bool(appended) and torch.equal(
                           appended[-1], sc["qs"][-1].view(-1, n_heads, dim).index_select(1, heads)),
                       "ok": list_ok == n_expected},
        "naive_position_scatter": {"rows_correct": pos_ok, "max_abs_err": pos_err,
                                   "ok": pos_ok == n_expected},
        "fixed": {"rows_correct": fixed_ok, "max_abs_err": fixed_err,
                  "stray_writes_max_abs": stray, "ok": fixed_ok == n_expected and stray == 0.0},
    }
