"""The marks of GPU tests, declared once: `gpu` (selected with `-m gpu`) and a skip without CUDA."""

import pytest
import torch

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU = [pytest.mark.gpu, NEEDS_CUDA]
# A module whose GPU tests share their engines' results (a module-level cache of worker runs):
# its tests run together in one child process (tests/gpu_isolation.py); every other GPU test
# gets a child of its own.
GPU_MODULE = [*GPU, pytest.mark.gpu_module]
# GPU tests that talk to a server through websockets' sync client, which warns on connect().
GPU_SERVER = [*GPU, pytest.mark.filterwarnings("ignore:connect\\(\\) must be used:DeprecationWarning")]
