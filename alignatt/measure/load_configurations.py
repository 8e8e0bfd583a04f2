"""The capacity benchmark's configurations: each a change to the server that `alignatt load` starts.

A `LoadConfiguration` holds the fields of `serve/config.py:ServerConfig` that one configuration
sets (the vLLM mode, settling, the engine in a process of its own, engine processes sharing the GPU,
verified re-drafts, batch-invariant kernels, FP8 weights, how often a settling draft's rows are read,
the prompt's history window, server processes on one port); `server_config` gives the server it stands for.
params.yaml lists them as mappings (`profiles.*.load.configurations`); a command line gives each as
`--configurations key=value,...` (or a JSON object). Its label (`fullgraph+settle2+process`) is
derived from it (`label`) and names it in the artifact and on the page; `from_label` reads the
labels that artifacts recorded, the one reader of that form. `alignatt.measure.capacity` runs each
configuration on a server of its own.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from alignatt.capture.names import VLLM_CAPTURE, VLLM_MODES, VLLM_QUANTIZATIONS
from alignatt.core.errors import AlignattError
from alignatt.core.prompt import ContextConfig
from alignatt.core.options import one_line
from alignatt.serve.config import DirectionRoute, EngineCount, ReplicaConfig, ServerConfig

# A label's mode when the configuration names none (the seam's own): `default+settle2`.
DEFAULT_MODE = "default"
OWN_PROCESS_FLAG = "process"
ENGINES_FLAG = re.compile(r"engines([1-9][0-9]*)")
FRONT_ENDS_FLAG = re.compile(r"frontends([2-9]|[1-9][0-9]+)")
SETTLE_FLAG = re.compile(r"settle([0-9]+)")
EVERY_FLAG = re.compile(r"every([1-9][0-9]*)")
SEQS_FLAG = re.compile(r"seqs([1-9][0-9]*)")
CHUNKED_FLAG = "chunked"
EXAMPLE = "vllm_mode=fullgraph,settle_buffer_tokens=2,own_process=true"


class LoadConfiguration(BaseModel):
    """One server of a load run: the ServerConfig fields it sets, each at ServerConfig's default
    unless given (so a configuration is a server anyone can serve: `server_config`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vllm_mode: str | None = Field(None, description="vllm_capture's mode: eager | cudagraph | fullgraph | compiled "
                                                    "(None: the seam's default)")
    settle_buffer_tokens: int | None = Field(
        None, ge=0, description="ServerConfig.settle_buffer_tokens: stop a partial draft N tokens past its first "
                                "held token (None: whole drafts, run to max_new_tokens)")
    own_process: bool = Field(False, description="ReplicaConfig.own_process: the one engine runs in a process of "
                                                 "its own (its thread never waits for the event loop's GIL)")
    engines: int | None = Field(None, ge=1, description="engine processes sharing the GPU (ServerConfig.engines "
                                                        "and ReplicaConfig.engines_per_gpu; None: the run's engines)")
    verify: bool = Field(False, description="vllm_capture: verified re-drafts (the session's previous draft as "
                                            "vLLM's speculative proposer)")
    batch_invariant: bool = Field(False, description="vllm_capture: vLLM's batch-invariant kernels")
    settle_every: int | None = Field(None, ge=1, description="vllm_capture: tokens between two reads of a settling "
                                                             "draft's rows (None: the engine's default)")
    chunked_history: bool = Field(False, description="ContextConfig.history_window chunked: a closed utterance "
                                                     "appends to the prompt's history until a cut (False: sliding)")
    quantization: str | None = Field(None, description="vllm_capture: vLLM's online weight quantization "
                                                       f"({', '.join(VLLM_QUANTIZATIONS)}; None: the model's dtype)")
    front_ends: int = Field(1, ge=1, description="ServerConfig.front_ends: server processes on the one port, "
                                                 "drafting on the same engine processes")
    max_num_seqs: int | None = Field(None, ge=1, description="vllm_capture: vLLM's running-batch limit (None: the "
                                                              "served one, serve/config.py SERVED_VLLM_OPTIONS)")

    @model_validator(mode="before")
    @classmethod
    def _entry(cls, value: Any) -> Any:
        """A command line's `key=value,...` or JSON object; a key no field knows, in one line."""
        if isinstance(value, str):
            value = _parse_text(value)
        if isinstance(value, dict):
            unknown = [k for k in value if k not in cls.model_fields]
            if unknown:
                raise ValueError(f"unknown configuration key {unknown[0]!r}: use {', '.join(cls.model_fields)}")
        return value

    @field_validator("vllm_mode", "quantization")
    @classmethod
    def _known(cls, value: str | None, info: ValidationInfo) -> str | None:
        known = {"vllm_mode": VLLM_MODES, "quantization": VLLM_QUANTIZATIONS}[info.field_name]
        if value is not None and value not in known:
            raise ValueError(f"unknown {info.field_name} {value!r}: use one of {', '.join(known)}")
        return value

    def flags(self) -> list[str]:
        """The label's flags, in the order labels have always been written (settle, process, engines,
        verify, batch_invariant, then the quantization, the settle reads' period, the history window,
        the front ends, vLLM's batch limit)."""
        return ([f"settle{self.settle_buffer_tokens}"] if self.settle_buffer_tokens is not None else []) + \
            ([OWN_PROCESS_FLAG] if self.own_process else []) + \
            ([f"engines{self.engines}"] if self.engines is not None else []) + \
            (["verify"] if self.verify else []) + (["batch_invariant"] if self.batch_invariant else []) + \
            ([self.quantization] if self.quantization else []) + \
            ([f"every{self.settle_every}"] if self.settle_every is not None else []) + \
            ([CHUNKED_FLAG] if self.chunked_history else []) + \
            ([f"frontends{self.front_ends}"] if self.front_ends > 1 else []) + \
            ([f"seqs{self.max_num_seqs}"] if self.max_num_seqs is not None else [])

    def label(self) -> str | None:
        """Its name in the artifact and on the page: `mode[+flag...]` (None: the seam's default, unchanged)."""
        flags = self.flags()
        if self.vllm_mode is None and not flags:
            return None
        return "+".join([self.vllm_mode or DEFAULT_MODE, *flags])

    def seam_options(self) -> dict[str, Any]:
        """What it changes in the route's seam options (the engine's)."""
        return ({"vllm_mode": self.vllm_mode} if self.vllm_mode else {}) | \
            ({"verify": True} if self.verify else {}) | ({"batch_invariant": True} if self.batch_invariant else {}) | \
            ({"quantization": self.quantization} if self.quantization else {}) | \
            ({"settle_every": self.settle_every} if self.settle_every is not None else {}) | \
            ({"max_num_seqs": self.max_num_seqs} if self.max_num_seqs is not None else {})

    def plain_engine(self) -> "LoadConfiguration":
        """Its engine alone (mode, batch-invariant kernels, quantization): what the capture cost
        measures, which drafts carry no proposal to verify and run on one engine."""
        return LoadConfiguration(vllm_mode=self.vllm_mode, batch_invariant=self.batch_invariant,
                                 quantization=self.quantization)

    def server_config(self, route: DirectionRoute, direction: str = "en-de", engines: EngineCount = 1,
                      **fields: Any) -> ServerConfig:
        """The server it stands for: `route` with its seam options, its settling and engine processes;
        `engines` where it names none; `fields`: the rest of ServerConfig (host, port, limits, ...)."""
        route = route.model_copy(update={"seam_options": {**route.seam_options, **self.seam_options()}})
        if self.chunked_history:
            context = fields.pop("context", None) or ContextConfig()
            fields["context"] = context.model_copy(update={"history_window": "chunked"})
        return ServerConfig(directions={direction: route}, engines=self.engines or engines,
                            replicas=ReplicaConfig(engines_per_gpu=self.engines or 1, own_process=self.own_process),
                            settle_buffer_tokens=self.settle_buffer_tokens, front_ends=self.front_ends, **fields)

    @classmethod
    def from_label(cls, label: str | None) -> "LoadConfiguration":
        """The configuration a recorded label names (`fullgraph+settle2+process`; None: the seam's
        default): how artifacts written before configurations were entries are read."""
        if label is None:
            return cls()
        mode, *flags = [part.strip() for part in label.split("+")]
        fields: dict[str, Any] = {} if mode == DEFAULT_MODE else {"vllm_mode": mode}
        for flag in flags:
            settle, engines, every = SETTLE_FLAG.fullmatch(flag), ENGINES_FLAG.fullmatch(flag), EVERY_FLAG.fullmatch(flag)
            front_ends, seqs = FRONT_ENDS_FLAG.fullmatch(flag), SEQS_FLAG.fullmatch(flag)
            key, value = (("settle_buffer_tokens", int(settle[1])) if settle else ("engines", int(engines[1])) if engines
                          else ("settle_every", int(every[1])) if every
                          else ("front_ends", int(front_ends[1])) if front_ends
                          else ("max_num_seqs", int(seqs[1])) if seqs
                          else ("own_process", True) if flag == OWN_PROCESS_FLAG
                          else ("chunked_history", True) if flag == CHUNKED_FLAG
                          else (flag, True) if flag in ("verify", "batch_invariant")
                          else ("quantization", flag) if flag in VLLM_QUANTIZATIONS else (None, None))
            if key is None:
                raise AlignattError(f"unknown configuration flag {flag!r} in {label!r}: use settle<N>, "
                                    f"{OWN_PROCESS_FLAG}, engines<N>, verify, batch_invariant, "
                                    f"{', '.join(VLLM_QUANTIZATIONS)}, every<N>, {CHUNKED_FLAG}, frontends<N> or seqs<N>")
            if key in fields:
                raise AlignattError(f"configuration {label!r} names {key} twice")
            fields[key] = value
        try:
            return cls(**fields)
        except ValidationError as e:  # the mode
            raise AlignattError(one_line(e, f"configuration {label!r}: ")) from None


def _parse_text(text: str) -> dict[str, Any]:
    """`key=value,...` (`none` is None) or a JSON object, as a mapping."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"configuration {text!r} is not a JSON object ({e.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"configuration {text!r} is not a JSON object")
        return value
    pairs = [p.strip() for p in text.split(",") if p.strip()]
    if not pairs or any("=" not in p for p in pairs):
        raise ValueError(f"configuration {text!r}: write key=value pairs, comma-separated, e.g. {EXAMPLE}")
    return {k.strip(): None if v.strip().lower() in ("none", "null") else v.strip()
            for k, v in (p.split("=", 1) for p in pairs)}


@functools.cache
def served_configuration(seam: str = VLLM_CAPTURE, device: str = "cuda") -> LoadConfiguration:
    """What `alignatt serve` serves on a route of this seam and device by default, read from the
    server config it builds (serve/config.py: SERVED_VLLM_OPTIONS' mode, SERVED_SETTLE_BUFFER_TOKENS
    and the engine in a process of its own, on a vllm_capture CUDA route)."""
    from alignatt.serve.config import SERVED_VLLM_OPTIONS, server_config

    cfg = server_config(seam=seam, device=device)
    return LoadConfiguration(vllm_mode=SERVED_VLLM_OPTIONS["vllm_mode"] if seam == VLLM_CAPTURE else None,
                             settle_buffer_tokens=cfg.settle_buffer_tokens, own_process=cfg.replicas.own_process)


def served_default() -> LoadConfiguration:
    """The served default the page marks: a vllm_capture route on CUDA."""
    return served_configuration()


def served_default_label() -> str | None:
    """The served default's label, as the page names it."""
    return served_default().label()


def default_configurations(seam: str, device: str) -> list[LoadConfiguration]:
    """A load run's configurations unless told: the served default of this seam and device, then
    the same server drafting whole (one, where it already does)."""
    served = served_configuration(seam, device)
    return list(dict.fromkeys([served, served.model_copy(update={"settle_buffer_tokens": None})]))


def is_served_default(label: str | None, seam: str = VLLM_CAPTURE, device: str = "cuda") -> bool:
    """Whether a recorded label names what `alignatt serve` serves by default on a route of this seam
    and device (by configuration, not by its text): a CPU run's whole drafts are its served default."""
    return LoadConfiguration.from_label(label) == served_configuration(seam, device)
