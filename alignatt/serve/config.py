"""What the MT server serves: latency presets, limits, and each direction's model, seam and heads.

Presets are named configs (`low_latency`, `balanced`, `high_latency`); the WhisperLiveKit
client's names (`quality`, `balanced`, `low`) are aliases. `ServerConfig.directions` maps a
direction (`en-de`) to a `DirectionRoute` (model, seam, head set), so sessions of different
directions draft with their own heads; `ServerConfig.engines` says how many engines serve each
(one per GPU: `alignatt.serve.engine_devices`).
"""

from __future__ import annotations

from typing import Any, Callable, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from alignatt.capture.names import DEFAULT_SEAM, VLLM_CAPTURE
from alignatt.core.draft import Head, Seam
from alignatt.core.errors import AlignattError
from alignatt.core.policy import POLICY_PRESETS, PolicyConfig
from alignatt.core.prompt import ContextConfig
from alignatt.serve.protocol import UNKNOWN_PRESET, ProtocolError
from alignatt.serve.limits import SessionLimits
from alignatt.models.presets import DEFAULT_MODEL


class SessionPreset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    policy: PolicyConfig
    max_new_tokens: int = Field(16, ge=1)


SESSION_PRESETS: dict[str, SessionPreset] = {
    p.name: p
    for p in (
        SessionPreset(
            name="low_latency",
            description="follow the commit frontier closely: no border, no hold-back",
            policy=POLICY_PRESETS["low_latency"],
        ),
        SessionPreset(
            name="balanced",
            description="keep one committed word of margin before the frontier",
            policy=POLICY_PRESETS["balanced"],
        ),
        SessionPreset(
            name="high_latency",
            description="two words of margin, hold back one target word, emit at least one word",
            policy=POLICY_PRESETS["high_latency"],
        ),
    )
}
# Names other clients use for the same points (WhisperLiveKit's --alignatt-latency values and
# its documented --alignatt-preset example).
PRESET_ALIASES = {
    "low": "low_latency",
    "quality": "high_latency",
    "gemma_low_latency": "low_latency",
    "gemma_balanced": "balanced",
    "gemma_high_latency": "high_latency",
    "gemma_quality": "high_latency",
}


def resolve_preset(name: str) -> SessionPreset:
    key = PRESET_ALIASES.get(name, name)
    if key not in SESSION_PRESETS:
        supported = sorted(SESSION_PRESETS) + sorted(PRESET_ALIASES)
        raise ProtocolError(
            UNKNOWN_PRESET, f"unknown preset {name!r}; use one of {', '.join(supported)}",
            supported=supported,
        )
    return SESSION_PRESETS[key]


class ServerLimits(SessionLimits):
    """Every limit the server enforces; the per-session ones are inherited from `SessionLimits`."""

    max_sessions: int = Field(8, ge=1, description="more concurrent sessions get `busy`")
    max_frame_bytes: int = Field(256 * 1024, ge=1024, description="larger frames get bad_protocol")
    hard_frame_factor: int = Field(4, ge=1, description="frames past factor x limit close the socket (1009)")
    # Past the forced final no honest client gets near these; they bound what one update can cost.
    max_update_words: int = Field(400, ge=1, description="updates with more committed words are refused")
    max_word_chars: int = Field(200, ge=1, description="updates with longer words are refused")
    # A client that stops reading: its replies queue up, bounded; past a bound its session closes.
    max_outgoing_frames: int = Field(256, ge=1, description="replies queued for one client (close 1008 past it)")
    max_outgoing_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="bytes of replies queued for one client (close 1008 past it)"
    )
    max_pending_finals: int = Field(32, ge=1, description="finals queued for the engine per session (close 1008 past it)")
    send_stall_s: float = Field(30.0, gt=0, description="one reply blocked this long closes the session (1008)")
    init_timeout_s: float = Field(10.0, gt=0, description="a connection without init this long is closed (1008)")
    # Before init a connection holds no session slot, so it is bounded on its own: how many wait at
    # once, and how large a frame it may send (an init with its context and history fits).
    # At either bound the connection that has waited longest past a grace (1 s) is closed to make room
    # (`serve.host.WaitingPeers`); only when none has, is the newcomer refused (503 at the handshake).
    max_connections_before_init: int = Field(
        128, ge=1, description="connections without a session, in all (past it the longest-waiting makes room)")
    # One address holding idle sockets must not fill the bound above for everyone else; a burst of
    # honest connections from one host (a WhisperLiveKit host reconnecting its sessions) fits in it.
    max_connections_before_init_per_peer: int = Field(
        16, ge=1, description="connections without a session from one address (past it its longest-waiting "
                              "makes room)")
    max_init_frame_bytes: int = Field(
        64 * 1024, ge=1024, description="a larger frame before init gets bad_protocol, then close 1008")
    idle_timeout_s: float = Field(
        300.0, gt=0, description="a session with no frame this long (none of its updates waiting) is closed (1008)")
    ping_interval_s: float = Field(20.0, gt=0, description="WebSocket keepalive ping interval")
    ping_timeout_s: float = Field(20.0, gt=0, description="no pong this long closes the connection")
    # Server-side records (the smoke reads the step log); bounded in bytes, oldest dropped first.
    step_log_bytes: int = Field(8 * 1024 * 1024, ge=0, description="bytes of recent step records kept")
    session_log_bytes: int = Field(1024 * 1024, ge=0, description="bytes of recent init records kept")


class DirectionRoute(BaseModel):
    """What serves one direction: model, seam and alignment heads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(DEFAULT_MODEL, description="model preset or local checkpoint")
    seam: str = Field(DEFAULT_SEAM, description="capture seam: hf_eager | hf_qk_fast | vllm_capture")
    heads: str | None = Field(None, description="head-set file or bundled name (default: the model's)")
    top_k: int = Field(4, ge=1, description="alignment heads used")
    device: str = Field("cpu", description="torch device of the engine (cpu, cuda, cuda:N)")
    dtype: str | None = Field(None, description="float32 | bfloat16 (default: the model's)")
    seam_options: dict[str, Any] = Field(default_factory=dict, description="e.g. {'vllm_mode': 'eager'}")


# Engines per route: a number, or "auto" (one per visible GPU on a `cuda` route, else one).
EngineCount = int | Literal["auto"]


# ---- engine replicas: liveness and GPU sharing (alignatt.serve.engine_client, engine_devices) ----


class ReplicaConfig(BaseModel):
    """How engines in their own processes are watched, and how many share one GPU."""

    model_config = ConfigDict(extra="forbid")

    step_deadline_s: float = Field(20.0, gt=0, description="an engine process whose heartbeat stops this long, or "
                                                          "that leaves a call without work (a ping, a count) "
                                                          "unanswered this long, is hung: it is killed, its "
                                                          "sessions get processing_failed and reconnect")
    heartbeat_s: float = Field(1.0, gt=0, description="how often an engine process beats its heartbeat (from a "
                                                     "thread of its own, so it beats while it computes), how "
                                                     "often the watcher checks it, and pings one idle this long")
    # A step is bounded by its work, not by one fixed time: a long honest final is slow, not dead.
    step_token_s: float = Field(0.25, gt=0, description="a step may take step_deadline_s plus this per token of "
                                                        "work of the drafts running in it (new tokens, plus prompt "
                                                        "words); past that it is hung, heartbeat or not")
    max_step_s: float = Field(600.0, gt=0, description="a draft whose own step bound (step_deadline_s + "
                                                       "step_token_s x its work) passes this is refused before "
                                                       "it runs (bad_protocol: send shorter utterances)")
    engines_per_gpu: int = Field(1, ge=1, description="engine processes sharing one GPU; a vllm_capture route's "
                                                      "gpu_memory_utilization is split between them unless its "
                                                      "engine_kwargs set it")
    own_process: bool = Field(False, description="a route served by one engine runs it in a process of its own "
                                                 "too (as several always do): its engine thread then never waits "
                                                 "for the interpreter lock that the event loop and the sessions' "
                                                 "policy hold")


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="interface to listen on")
    port: int = Field(8765, ge=0, le=65535, description="TCP port (0 = any free port)")
    default_preset: str = Field("balanced", validation_alias=AliasChoices("default_preset", "preset"),
                                description="latency preset of a session whose init names none")
    directions: dict[str, DirectionRoute] = Field(default_factory=lambda: {"en-de": DirectionRoute()},
                                                  description="direction (source-target) -> what serves it")
    limits: ServerLimits = Field(default_factory=ServerLimits, description="every bound the server enforces")
    preload: bool = Field(True, description="load every direction's engine before listening")
    context: ContextConfig = Field(default_factory=ContextConfig, description="context/history bounds")
    engines: EngineCount = Field("auto", description="engines per route: 1 runs in this process; more run one "
                                                   "process each (one per GPU); auto: one per visible GPU on a "
                                                   "cuda route, else 1")
    replicas: ReplicaConfig = Field(default_factory=ReplicaConfig, description="engine processes: hung-engine "
                                                                          "deadline, engines per GPU")
    front_ends: int = Field(1, ge=1, description="server processes taking connections on the one port, each with "
                                                 "its own interpreter, all drafting on the same engines (each in a "
                                                 "process of its own); needs preload")
    # Who may connect (alignatt.serve.access).
    allow_origins: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("allow_origins", "allow_origin"),
        description="Origin header values accepted besides none (pages the operator trusts), comma-separated; "
                    "any other Origin is refused with 403 at the handshake")
    token_file: str | None = Field(None, description="file holding the shared token clients must present "
                                                     "(else the variable token_env names; neither: no token)")
    token_env: str | None = Field(None, description="environment variable holding the token when there is no "
                                                    "token_file (`alignatt serve`: ALIGNATT_TOKEN; servers that "
                                                    "measurements start read none)")
    insecure_no_token: bool = Field(False, description="listen beyond loopback without a token")
    ssl_certfile: str | None = Field(None, description="TLS certificate chain (PEM): serve wss://")
    ssl_keyfile: str | None = Field(None, description="TLS private key (PEM), if not in the certificate file")
    drain_s: float = Field(30.0, ge=0, description="on SIGTERM: no new sessions; an open utterance may finish for "
                                                   "this long, then its session is told to reconnect (1012), "
                                                   "and the server exits")
    settle_buffer_tokens: int | None = Field(
        None, ge=0, description="every session's SessionConfig.settle_buffer_tokens: stop a partial draft once "
                                "the policy's answer is known, N tokens past its first held token (None: never)")

    @field_validator("engines")
    @classmethod
    def _engines(cls, value: EngineCount) -> EngineCount:
        if value != "auto" and value < 1:
            raise ValueError("engines must be 'auto' or at least 1")
        return value

    @model_validator(mode="after")
    def _front_ends_preloaded(self) -> "ServerConfig":
        # the other front ends are handed the engines the first one loaded: every one, before listening
        if self.front_ends > 1 and not self.preload:
            raise ValueError("front_ends above 1 needs preload")
        return self


# What a served vLLM engine gets unless the route says otherwise: a growing utterance re-drafts a
# prompt whose prefix is already cached, the batch holds every admitted session, and every step is
# graphed (fullgraph: with many speakers most steps hold a prefill, which cudagraph runs eager, and
# an eager E4B step costs several graphed ones). Its padded prefills cost bitwise equality with
# eager, so the page scores cudagraph and says so; the measured gap is on the page and in
# docs/batching.md.
SERVED_VLLM_OPTIONS = {"enable_prefix_caching": True, "max_num_seqs": 128, "vllm_mode": "fullgraph"}

# What `alignatt serve` serves on a vllm_capture route on CUDA unless told otherwise: drafts settled
# 2 tokens past their first held token, the engine in a process of its own. It is the configuration
# that met the capacity targets on the H200 (the page's capacity table marks its row); whole drafts
# stay one option away (`--settle-buffer-tokens none`). Other routes draft whole by default: no
# measurement says settling pays there.
SERVED_SETTLE_BUFFER_TOKENS = 2


def served_own_process(seam: str, device: str) -> bool:
    """Whether `alignatt serve` runs a route's one engine in a process of its own by default: a
    vLLM engine on CUDA, whose step would otherwise wait for the sessions' interpreter lock."""
    return seam == VLLM_CAPTURE and device.startswith("cuda")


def served_settle(requested: int | None | str, seam: str, device: str) -> int | None:
    """settle_buffer_tokens from the option: "auto" (the served default above), "none" or N."""
    if requested is None or requested == "none":
        return None
    if requested == "auto":
        return SERVED_SETTLE_BUFFER_TOKENS if seam == VLLM_CAPTURE and device.startswith("cuda") else None
    try:
        tokens = int(requested)
    except ValueError:
        raise AlignattError(f"bad settle_buffer_tokens {requested!r}: auto, none or a number of tokens") from None
    if tokens < 0:
        raise AlignattError(f"bad settle_buffer_tokens {tokens}: at least 0")
    return tokens


# `alignatt serve`'s options (cli/serving.py builds them from these fields, with their defaults and
# descriptions): one direction's route, two limits, and these of the config.
SERVE_ROUTE_FIELDS = ("model", "seam", "heads", "top_k", "device", "dtype")
SERVE_LIMIT_FIELDS = ("max_sessions", "max_utterance_words")
SERVE_CONFIG_FIELDS = ("host", "port", "default_preset", "engines", "front_ends", "allow_origins", "token_file",
                       "insecure_no_token", "ssl_certfile", "ssl_keyfile", "drain_s")
# Who may connect: laid over a config file's too.
ACCESS_FIELDS = ("allow_origins", "token_file", "token_env", "insecure_no_token", "ssl_certfile", "ssl_keyfile")


def server_config(
    config_path: str | None = None,
    *,
    direction: str = "en-de",
    vllm_mode: str | None = None,
    settle_buffer_tokens: int | None | str = "auto",
    engine_process: bool | None = None,
    **fields: Any,
) -> ServerConfig:
    """A ServerConfig from a JSON file, or from one direction's options (the CLI's): `fields` are
    fields of `DirectionRoute`, `ServerLimits` or `ServerConfig` by name, the rest their defaults.
    With a file, only the fields of who may connect (`ACCESS_FIELDS`: origins, token, TLS) are laid
    over it. `settle_buffer_tokens`: "auto" (`served_settle`), "none" or N. `engine_process`: the
    route's one engine in a process of its own; None: so for vllm_capture on CUDA, where the engine
    thread otherwise waits for the interpreter lock of the sessions' policy and the event loop."""
    from pathlib import Path

    from pydantic import ValidationError

    try:
        if config_path:
            try:
                text = Path(config_path).read_text()
            except OSError as e:
                raise AlignattError(f"cannot read server config {config_path}: {e.strerror}") from None
            cfg = ServerConfig.model_validate_json(text)
            access = {k: v for k, v in fields.items() if k in ACCESS_FIELDS}
            if access:
                cfg = ServerConfig.model_validate({**cfg.model_dump(), **access})
        else:
            route_fields = {k: fields.pop(k) for k in list(fields) if k in DirectionRoute.model_fields}
            limit_fields = {k: fields.pop(k) for k in list(fields) if k in ServerLimits.model_fields}
            if vllm_mode:
                route_fields["seam_options"] = {"vllm_mode": vllm_mode}
            route = DirectionRoute(**route_fields)
            cfg = ServerConfig(
                directions={direction.strip().lower(): route},
                limits=ServerLimits(**limit_fields),
                settle_buffer_tokens=served_settle(settle_buffer_tokens, route.seam, route.device),
                replicas=ReplicaConfig(own_process=served_own_process(route.seam, route.device)
                                       if engine_process is None else engine_process),
                **fields,
            )
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise AlignattError(f"bad server config: {where}: {first['msg']}") from None
    for name in cfg.directions:
        if len(name.split("-")) != 2 or not all(name.split("-")):
            raise AlignattError(f"bad direction {name!r}: write it as source-target, e.g. en-de")
    try:
        resolve_preset(cfg.default_preset)
    except ProtocolError as e:
        raise AlignattError(e.message) from None
    return cfg


def resolve_heads(route: DirectionRoute, direction: str) -> list[Head]:
    from alignatt.heads.sets import default_heads, load_head_set

    if route.heads:
        return load_head_set(route.heads).top_k(route.top_k)
    return default_heads(route.model, route.top_k, direction)


def head_set_name(route: DirectionRoute, direction: str) -> str:
    """What `resolve_heads` reads: the route's file or bundled name, or the model's default set."""
    from alignatt.heads.sets import default_head_set_name

    return route.heads or default_head_set_name(route.model, direction)


SeamFactory = Callable[[DirectionRoute, list[Head]], Seam]


def default_seam_factory(route: DirectionRoute, heads: list[Head]) -> Seam:
    from alignatt.capture.registry import make_seam

    return make_seam(route.seam, model=route.model, heads=heads, device=route.device, dtype=route.dtype,
                     **route.seam_options)
