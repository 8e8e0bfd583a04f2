"""Shared inputs for the transformers-seam tests: a spread of benchmark requests, and the tiny
Gemma-4 inside the multimodal wrapper that `-it` checkpoints load as."""

from __future__ import annotations

import dataclasses

import torch

from alignatt.checks.seam_parity import default_requests


def some_requests(max_new_tokens: int = 10) -> list:
    """(id, request): short and long sources, each without and with a target prefix."""
    every = default_requests(max_new_tokens)
    return [every[i] for i in (0, 1, len(every) - 2, len(every) - 1)]


def in_multimodal_wrapper(tiny):
    """google/gemma-4-E4B-it loads as Gemma4ForConditionalGeneration: the same text model inside."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    from alignatt.core.layout import AttentionLayout

    with torch.random.fork_rng(devices=[]):
        wrapper = Gemma4ForConditionalGeneration(Gemma4Config(text_config=tiny.model.config)).eval()
    wrapper.model.language_model.load_state_dict(tiny.model.model.state_dict())
    return dataclasses.replace(tiny, model=wrapper, layout=AttentionLayout.from_config(wrapper.config))
