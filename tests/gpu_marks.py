"""The marks of GPU tests, declared once: `gpu` (selected with `-m gpu`) and a skip without CUDA."""

import pytest
import torch

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU = [pytest.mark.gpu, NEEDS_CUDA]
# GPU tests whose engines run in worker processes of their own (check-vllm's workers, the batching
# worker) and that share those workers' results across their module: they stay in the parent
# pytest process; every other GPU test runs in a child (tests/gpu_isolation.py).
GPU_WORKERS = [*GPU, pytest.mark.gpu_workers]
# GPU tests that talk to a server through websockets' sync client, which warns on connect().
GPU_SERVER = [*GPU, pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")]
