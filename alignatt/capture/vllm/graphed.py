"""The fetch's device work replayed as CUDA graphs, one per padded batch shape.

Eagerly, a step's fetch launches some forty small ops (per layer a gather of q and one of the
keys, per group a matmul, a softmax, a gather of the source columns and masked sums), and at 128
speakers their launches cost more host time than the GPU spends running them (docs/batching.md).
Here the batch is padded to a few sizes (`batched.bucket`), and each layout of the packed indices
is captured once and then replayed: the step's host work becomes packing, one copy of the indices
into fixed device buffers, and one graph launch.

Every graph reads the same input buffers and writes the same output buffer, and all of them share
one memory pool: they are replayed one at a time on the engine's stream, and a replay's output is
copied to the host before the next replay is queued. A buffer too small for a new layout is
replaced by a larger one, and the graphs captured on the old one are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch

from alignatt.capture.vllm.batched import Packer


class GraphedRebuild:
    """`run(packer, shape)`: the rebuild of one packed batch, as a replay of its layout's graph."""

    def __init__(self, device: torch.device, rebuild: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                 max_graphs: int = 2048) -> None:
        self.device = device
        self.rebuild = rebuild  # device ops only: the views of the inputs -> the output [R, T, H, S + 4]
        self.max_graphs = max_graphs  # the least recently replayed go first (each holds its launch plan)
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)  # captures run on a side stream (the current one may be busy)
        self.inputs = {kind: torch.empty(0, dtype=dtype, device=device) for kind, (_, dtype) in Packer.KINDS.items()}
        self.out = torch.empty(0, dtype=torch.float32, device=device)
        self.graphs: OrderedDict[tuple, torch.cuda.CUDAGraph] = OrderedDict()
        self.captured = 0  # graphs captured so far
        self.replays = 0
        self.regrown = 0  # times the buffers grew (and the graphs were dropped)

    def run(self, packer: Packer, host: dict[str, torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
        """Copy the batch's indices (`packer.to_host`) in and replay its graph (capturing it first if
        new). Returns a view of the shared output: read it (or queue its copy) before the next `run`."""
        n_out = shape[0] * shape[1] * shape[2] * shape[3]
        self._fit({kind: t.numel() for kind, t in host.items()}, n_out)
        for kind, t in host.items():
            self.inputs[kind][: t.numel()].copy_(t, non_blocking=True)
        key = (packer.layout(), shape)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(packer, shape, n_out)
            self.graphs[key] = graph
            if len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        graph.replay()
        self.replays += 1
        return self.out[:n_out].view(shape)

    def _fit(self, n_in: dict[str, int], n_out: int) -> None:
        """Grow a buffer that is too small (to the next power of two: few regrowths), dropping every
        graph, since each has the old buffers' addresses baked in."""
        grown = False
        for kind, n in n_in.items():
            if self.inputs[kind].numel() < n:
                self.inputs[kind] = torch.empty(1 << (n - 1).bit_length(), dtype=self.inputs[kind].dtype,
                                                device=self.device)
                grown = True
        if self.out.numel() < n_out:
            self.out = torch.empty(1 << (n_out - 1).bit_length(), dtype=torch.float32, device=self.device)
            grown = True
        if grown:
            self.graphs.clear()
            # The pool dies with the last graph that used it: capturing into its old handle again
            # fails an allocator assertion (torch 2.9, H100, 2026-12-06). A new pool, then.
            self.pool = torch.cuda.graph_pool_handle()
            self.regrown += 1

    def _capture(self, packer: Packer, shape: tuple[int, ...], n_out: int) -> torch.cuda.CUDAGraph:
        ix = packer.views(self.inputs)
        out = self.out[:n_out].view(shape)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the inputs' copies first
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            out.copy_(self.rebuild(ix))  # warm-up outside the capture: lazy kernel and cuBLAS set-up
            # thread_local: another thread's CUDA calls (vLLM's output copies) do not break the capture
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                out.copy_(self.rebuild(ix))
            finally:
                graph.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.captured += 1
        return graph
