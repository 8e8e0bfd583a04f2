"""The load benchmark's configuration labels: a vLLM mode with `+flags` (`fullgraph+settle2+process`).

A label names a configuration in the artifact and on the page. Engine flags set the engine's options
(`verify`, `batch_invariant`); server flags set how the server runs it (`process`, `engines<N>`,
`settle<N>`). `alignatt.measure.capacity` runs each configuration of a run on a server of its own.
"""

from __future__ import annotations

import re
from typing import Any

from alignatt.core.errors import AlignattError

# Flags a configuration label may add to its vLLM mode (`fullgraph+batch_invariant`): engine options.
# `verify`: verified re-drafts (the session's previous draft as vLLM's speculative proposer), so
# `--vllm-mode fullgraph,fullgraph+verify` runs verification off and on in one run.
CONFIGURATION_FLAGS: dict[str, dict[str, Any]] = {"batch_invariant": {"batch_invariant": True},
                                                  "verify": {"verify": True}}
# Server flags: `fullgraph+engines4` serves the route from 4 engine processes sharing the GPU
# (ServerConfig.engines, ReplicaConfig.engines_per_gpu); `fullgraph+process` runs its one engine in a
# process of its own (ReplicaConfig.own_process), where the engine thread never waits for the
# interpreter lock of the event loop and the sessions' policy (docs/batching.md).
ENGINES_FLAG = re.compile(r"engines([1-9][0-9]*)")
OWN_PROCESS_FLAG = "process"
# `fullgraph+settle4`: every session stops a partial draft once the policy's answer is known, 4 tokens
# past its first held token (ServerConfig.settle_buffer_tokens, core/settle.py).
SETTLE_FLAG = re.compile(r"settle([0-9]+)")


def parse_configuration(label: str | None) -> tuple[str | None, dict[str, Any]]:
    """A configuration label, `mode[+flag...]` (e.g. `fullgraph+batch_invariant`): the vLLM mode and
    the engine options its flags set. The label names the configuration in the artifact and report."""
    from alignatt.capture.names import VLLM_MODES

    if label is None:
        return None, {}
    mode, flags = label.split("+")[0].strip(), label_flags(label)
    if mode not in VLLM_MODES:
        raise AlignattError(f"unknown vllm_mode {mode!r}: use one of {', '.join(VLLM_MODES)}")
    flags = [f for f in flags if not _server_flag(f)]  # configuration_engines reads them
    unknown = [f for f in flags if f not in CONFIGURATION_FLAGS]
    if unknown:
        raise AlignattError(f"unknown configuration flag {unknown[0]!r} in {label!r}: use "
                            f"{', '.join(CONFIGURATION_FLAGS)}, {OWN_PROCESS_FLAG}, engines<N> or settle<N>")
    return mode, {k: v for f in flags for k, v in CONFIGURATION_FLAGS[f].items()}


def label_flags(label: str | None) -> list[str]:
    """A configuration label's flags: what follows its mode, `+`-separated."""
    return [part.strip() for part in (label or "").split("+")[1:]]


def _server_flag(flag: str) -> bool:
    return flag == OWN_PROCESS_FLAG or any(f.fullmatch(flag) for f in (ENGINES_FLAG, SETTLE_FLAG))


def plain_engine_label(label: str | None) -> str | None:
    """The label without its verify and server flags: the engine the capture cost measures."""
    if label is None:
        return None
    return "+".join([label.split("+")[0].strip(), *(f for f in label_flags(label) if f != "verify" and not _server_flag(f))])


def _counted_flag(label: str | None, pattern: re.Pattern, name: str) -> int | None:
    """N of a label's one `<name>N` flag (None: the label has none)."""
    counts = [int(m.group(1)) for flag in label_flags(label) if (m := pattern.fullmatch(flag))]
    if len(counts) > 1:
        raise AlignattError(f"configuration {label!r} names more than one {name}<N> flag")
    return counts[0] if counts else None


def configuration_engines(label: str | None) -> int | None:
    """The engine processes a configuration label's `engines<N>` flag asks for on the GPU (None: the
    run's `engines` option, one engine in the server's process by default)."""
    return _counted_flag(label, ENGINES_FLAG, "engines")


def configuration_settle(label: str | None) -> int | None:
    """The buffer tokens of a configuration label's `settle<N>` flag (None: drafts run to max_new_tokens)."""
    return _counted_flag(label, SETTLE_FLAG, "settle")


def served_default_label() -> str:
    """The label of what `alignatt serve` serves on a vllm_capture route on CUDA by default (its mode,
    settling and own engine process: serve/config.py), so that the page can mark the
    capacity row of the served default and a load run can measure it."""
    from alignatt.serve.config import SERVED_SETTLE_BUFFER_TOKENS, SERVED_VLLM_OPTIONS

    return f"{SERVED_VLLM_OPTIONS['vllm_mode']}+settle{SERVED_SETTLE_BUFFER_TOKENS}+{OWN_PROCESS_FLAG}"
