"""The fetch's device work replayed as CUDA graphs, one per padded batch shape.

Eagerly, a step's fetch launches a hundred-odd small ops (the indices built from the packed
arrays, then per layer a gather of q and one of the keys, per group a matmul, a softmax, a gather
of the source columns and masked sums). At 128 speakers on the H200 the eager fetch's host time was
several times its GPU time (3.1 ms against 0.27 ms a step, 33f3b17 and 76fa219).
Here the batch is padded to a few sizes (`batched.bucket`), and each layout of the packed arrays
is captured once, index building included (`batched.expand_indices`), and then replayed: the
step's host work becomes packing, one copy into a fixed device buffer, and one graph launch.

Every graph reads the same input buffer and writes the same output buffer, and all of them share
one memory pool: they are replayed one at a time on the engine's stream, and a replay's output is
copied to the host before the next replay is queued. A buffer too small for a new layout is
replaced by a larger one, and the graphs captured on the old one are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch

from alignatt.capture.vllm.batched import BatchShape, Packer


class GraphedRebuild:
    """`run(packer, host, shape, out_shape)`: the rebuild of one packed batch, as a replay of its graph."""

    def __init__(self, device: torch.device,
                 rebuild: Callable[[dict[str, torch.Tensor], BatchShape], torch.Tensor], max_graphs: int = 2048) -> None:
        self.device = device
        self.rebuild = rebuild  # device ops only: the packed arrays' views and the shape -> [R, T, H, S + 4]
        self.max_graphs = max_graphs  # the least recently replayed go first (each holds its launch plan)
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)  # captures run on a side stream (the current one may be busy)
        self.inputs = torch.empty(0, dtype=torch.int64, device=device)
        self.out = torch.empty(0, dtype=torch.float32, device=device)
        self.graphs: OrderedDict[tuple, torch.cuda.CUDAGraph] = OrderedDict()
        self.captured = 0  # graphs captured so far
        self.replays = 0
        self.regrown = 0  # times the buffers grew (and the graphs were dropped)

    def run(self, packer: Packer, host: torch.Tensor, shape: BatchShape, out_shape: tuple[int, ...]) -> torch.Tensor:
        """Copy the batch's packed arrays (`packer.to_host`) in and replay its graph (capturing it
        first if new). Returns a view of the shared output: read it (or queue its copy) before the
        next `run`."""
        n_out = out_shape[0] * out_shape[1] * out_shape[2] * out_shape[3]
        self._fit(host.numel(), n_out)
        self.inputs[: host.numel()].copy_(host, non_blocking=True)
        key = (packer.layout(), shape)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(packer, shape, out_shape, n_out)
            self.graphs[key] = graph
            if len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        graph.replay()
        self.replays += 1
        return self.out[:n_out].view(out_shape)

    def _fit(self, n_in: int, n_out: int) -> None:
        """Grow a buffer that is too small (to the next power of two: few regrowths), dropping every
        graph, since each has the old buffers' addresses baked in."""
        grown = False
        if self.inputs.numel() < n_in:
            self.inputs = torch.empty(1 << (n_in - 1).bit_length(), dtype=torch.int64, device=self.device)
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

    def _capture(self, packer: Packer, shape: BatchShape, out_shape: tuple[int, ...], n_out: int) -> torch.cuda.CUDAGraph:
        ix = packer.views(self.inputs)
        out = self.out[:n_out].view(out_shape)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the inputs' copy first
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream):
            out.copy_(self.rebuild(ix, shape))  # warm-up outside the capture: lazy kernel and cuBLAS set-up
            # thread_local: another thread's CUDA calls (vLLM's output copies) do not break the capture
            graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            try:
                out.copy_(self.rebuild(ix, shape))
            finally:  # (only once begun: ending a capture that never began would hide why)
                graph.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.captured += 1
        return graph
