"""`alignatt load`: N concurrent real-time speakers on one MT server, and what each load level costs.

The server runs in-process on loopback (one engine unless `engines` says more, each engine's
scheduler batching the drafts of the sessions placed on it). For each N in `speakers`, N native
clients (`alignatt.replay.stream`) each replay a stream in real time through their own
WebSocket, from client processes of their own (alignatt.replay.speakers: not the server's
interpreter lock) (lockstep by default: an update waits for its reply; `pacing=realtime`: sent
when due, never waiting), starts staggered by `stagger_s`; speaker i replays stream i mod
len(streams) (the bundled smoke stream and a composed multi-minute stream by default). Per level
the `load` artifact records partial and final RTT, schedule lag (max, and whether it grows),
fast-path events, the engines' batch-size histogram (summed, and per engine in `engines`), peak
GPU memory, retractions, finals delivered in order, error frames, and how many updates differ
from the same stream served alone, or served by the run's first configuration (the summaries are
`alignatt.measure.capacity_levels`). On a GPU
with `vllm_capture` it also measures the capture cost: captured vs uncaptured `draft_many` wall at
each batch size, same prompts, same run (after the server has stopped, one engine at a time).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, field_validator, model_validator

from alignatt.capture.names import VLLM_CAPTURE
from alignatt.core.draft import acceptance_level
from alignatt.core.errors import AlignattError
from alignatt.core.progress import progress_bar
from alignatt.models.presets import preset_for
from alignatt.replay.speakers import SpeakerPlan, run_speakers
from alignatt.measure.gpu_busy import GpuBusy, route_gpu
from alignatt.measure.host_cpu import cpu_times, loop_shares, shares, thread_cores, thread_cpu_s
from alignatt.measure.kernel_profiles import KernelProfiles
from alignatt.record.artifacts.options import LoadKnobs
from alignatt.measure.capacity_levels import (LAG_GROWTH_S, configuration_difference, level_line, merge_front_ends,
                                              signature, summarise_level)
from alignatt.measure.load_configurations import LoadConfiguration, default_configurations
from alignatt.replay.stream import SmokeStream, load_stream

BUNDLED_STREAMS = {"smoke": "mt_server_smoke_stream.json", "long": "mt_load_long_stream.json"}


def _int_list(value: Any) -> list[int]:
    if isinstance(value, str):
        try:
            return [int(x) for x in value.replace(" ", "").split(",") if x]
        except ValueError:
            raise ValueError(f"expected comma-separated integers, got {value!r}") from None
    if isinstance(value, int) and not isinstance(value, bool):  # `speakers: 128` in YAML, or `-S ...=128`
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected comma-separated integers, got {value!r}")
    return [int(x) for x in value]


class LoadOptions(LoadKnobs):
    configurations: list[LoadConfiguration] | None = Field(
        None, validation_alias=AliasChoices("configurations", "configuration"),
        description="the servers measured, one after another: each the ServerConfig fields it sets, key=value "
                    "pairs, comma-separated (vllm_mode, settle_buffer_tokens, own_process, engines, verify, "
                    "batch_invariant), the option once per configuration, e.g. vllm_mode=fullgraph,"
                    "settle_buffer_tokens=2,own_process=true (default: what `alignatt serve` serves on this seam "
                    "and device, then the same drafting whole)")

    @field_validator("kernel_profile_speakers", mode="before")
    @classmethod
    def _levels(cls, value: Any) -> list[int]:
        return _int_list(value) if value not in (None, "") else []

    @field_validator("compared_speakers", mode="before")
    @classmethod
    def _compared(cls, value: Any) -> list[int] | None:
        return _int_list(value) if value not in (None, "") else None

    @field_validator("speakers", "capture_cost_batches", mode="before")
    @classmethod
    def _ints(cls, value: Any) -> list[int]:
        out = _int_list(value)
        if not out or min(out) < 1:
            raise ValueError("give at least one count, each >= 1")
        return out

    @field_validator("engines")
    @classmethod
    def _engines(cls, value: int | str) -> int | str:
        if value != "auto" and value < 1:  # as ServerConfig says, but before any level is measured
            raise ValueError("engines must be 'auto' or at least 1")
        return value

    @field_validator("streams", mode="before")
    @classmethod
    def _names(cls, value: Any) -> list[str]:
        return [s for s in value.split(",") if s] if isinstance(value, str) else list(value)

    @field_validator("configurations", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, (str, dict)) else value

    @model_validator(mode="after")
    def _profiled_levels(self) -> "LoadOptions":
        unmeasured = sorted(set(self.kernel_profile_speakers) - set(self.speakers))
        if unmeasured:  # it would never be armed: the run would end with no profile and no word why
            raise ValueError(f"kernel_profile_speakers {unmeasured[0]} is not a level of speakers "
                             f"{','.join(map(str, self.speakers))}: profile a level the run measures")
        extra = sorted(set(self.compared_speakers or []) - set(self.speakers))
        if extra:
            raise ValueError(f"compared_speakers {extra[0]} is not a level of speakers "
                             f"{','.join(map(str, self.speakers))}: compare at levels the first configuration runs")
        return self

    @model_validator(mode="after")
    def _configurations(self) -> "LoadOptions":
        if self.configurations is None:
            self.configurations = default_configurations(self.seam, self.device)
        if not self.configurations:
            raise ValueError("configurations: give at least one")
        engine = next((c for c in self.configurations if c.seam_options()), None)
        if engine is not None and self.seam != VLLM_CAPTURE:  # before any level is measured
            raise ValueError(f"configuration {engine.label()} sets vllm_capture's engine options: use --seam "
                             "vllm_capture")
        return self

    def runs(self) -> list[LoadConfiguration]:
        """The configurations, as validated (the default resolved)."""
        return list(self.configurations or [])

    def for_later_configurations(self) -> "LoadOptions":
        """The options a configuration after the first runs with: `compared_speakers`' levels (and the
        kernel profiles among them)."""
        if self.compared_speakers is None:
            return self
        levels = self.compared_speakers
        return self.model_copy(update={"speakers": levels, "compared_speakers": None,
                                       "kernel_profile_speakers": [n for n in self.kernel_profile_speakers
                                                                   if n in levels]})


def resolve_streams(names: list[str]) -> list[tuple[str, SmokeStream]]:
    from importlib import resources

    out = []
    for name in names:
        if name in BUNDLED_STREAMS:
            path = resources.files("alignatt") / "data" / BUNDLED_STREAMS[name]
            out.append((name, load_stream(str(path))))
        else:
            out.append((name, load_stream(name)))
    if not out:
        raise AlignattError("no streams to replay")
    return out


def _wait_for_sessions_to_close(handle: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while handle.call(lambda: handle.server.slots.count) > 0:
        if time.monotonic() > deadline:
            raise AlignattError(f"sessions of the previous load level still open after {timeout_s:.0f}s")
        time.sleep(0.05)


def engine_stats(handle: Any) -> list[dict]:
    """Every engine's `Engine.stats`, summed over the server's front ends."""
    return merge_front_ends(handle.call(handle.server.engine_stats))


def _reset_gpu_peak() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
    except Exception:  # noqa: BLE001 - memory figures are best effort
        pass


def _gpu_memory() -> tuple[float | None, float | None]:
    try:
        import torch

        if not torch.cuda.is_available():
            return None, None
        free, total = torch.cuda.mem_get_info()
        return round(torch.cuda.max_memory_allocated() / 2**20, 1), round((total - free) / 2**20, 1)
    except Exception:  # noqa: BLE001
        return None, None


# ---- the run ----


def _route(options: LoadOptions, configuration: LoadConfiguration):
    from alignatt.serve.config import DirectionRoute

    seam_options: dict[str, Any] = configuration.seam_options()
    if options.seam == VLLM_CAPTURE:
        if options.prefix_caching is not None:
            seam_options["enable_prefix_caching"] = options.prefix_caching
        if options.max_num_seqs is not None:
            seam_options["max_num_seqs"] = options.max_num_seqs
    return DirectionRoute(model=options.model, seam=options.seam, heads=options.heads, top_k=options.top_k,
                          device=options.device, dtype=options.dtype, seam_options=seam_options)


def run_configuration(options: LoadOptions, configuration: LoadConfiguration, seam_factory=None) -> dict:
    """Every load level on the server of one configuration: its levels, engine facts and heads."""
    from alignatt.serve.config import ServerLimits, resolve_preset
    from alignatt.serve.engine_client import ProcessBatchSeam
    from alignatt.serve.server import ServerThread

    preset = resolve_preset(options.preset).name
    streams = resolve_streams(options.streams)
    mode = configuration.label()  # the levels' name in the artifact
    config = configuration.server_config(_route(options, configuration), engines=options.engines,
                                         host="127.0.0.1", port=0, default_preset=preset,
                                         limits=ServerLimits(max_sessions=max(options.speakers)))
    route = config.directions["en-de"]
    levels: list[dict] = []
    alone: dict[str, dict[int, tuple]] = {}
    with ServerThread(config, seam_factory) as handle:
        plan = SpeakerPlan(handle.url, preset, options.speed, options.stagger_s, options.pacing,
                           tuple(s.model_dump() for _, s in streams), options.stop_lag_s)
        engines = handle.server.registry.engines
        engine = engines[0]
        in_children = any(isinstance(e.seam, ProcessBatchSeam) for e in engines)
        describe = getattr(engine.seam, "describe", None)
        totals = getattr(engine.seam, "acceptance_totals", None)  # verification counts (a child's over its pipe)
        profiled = _profiled_engines(options, mode, engines)
        # closed on an error too: an open bar keeps printing its heartbeat after the error line
        with progress_bar(len(set(options.speakers)), f"load {mode or options.seam}", "level") as bar:
            for n in sorted(set(options.speakers)):
                _wait_for_sessions_to_close(handle)  # the last level's sessions hold admission slots until closed
                before = engine_stats(handle)
                accepted_before = totals() if callable(totals) else None
                counters_before = handle.call(handle.server.level_counters)
                _reset_gpu_peak()
                gpu = route_gpu(route.device)
                for name, seam in profiled.items():
                    seam.profile(str(Path(options.engine_profile_dir) / f"{name}_{n}.pstats"))
                cpu_before, threads_before = cpu_times(), thread_cpu_s()
                # the loop thread's own clock, read on the loop; the server runs in this process
                loop_before, process_before = handle.call(time.thread_time), time.process_time()
                with GpuBusy(gpu) if gpu is not None else nullcontext() as busy, \
                        KernelProfiles(options, mode, engines, n) as kernels:
                    runs, wall = run_speakers(plan, n, options.clients, options.speakers_per_process)
                host = shares(cpu_before, cpu_times())
                host["server_thread_cpu_cores"] = thread_cores(threads_before, thread_cpu_s(), wall)
                counters = handle.call(handle.server.level_counters)
                if counters["front_end_cpu_s"]:
                    host["front_end_cpu_cores"] = [
                        None if before is None or after is None else round((after - before) / wall, 4)
                        for before, after in zip(counters_before["front_end_cpu_s"], counters["front_end_cpu_s"])]
                host.update(loop_shares(handle.call(time.thread_time) - loop_before,
                                        time.process_time() - process_before, wall))
                for seam in profiled.values():
                    seam.profile(None)
                memory = _gpu_memory()
                if in_children:  # engines in processes of their own: none of their memory is this process's
                    memory = (None, memory[1])
                after = engine_stats(handle)
                delta = {"coalesced": counters["coalesced"] - counters_before["coalesced"]}
                level = summarise_level(n, runs, streams, wall, before, after, delta, memory, alone)
                level["vllm_mode"] = mode
                level["gpu_busy_share"] = busy.share() if busy is not None else None
                if kernels.armed:
                    level["step_anatomy"] = kernels.results()
                level.update(host)
                if accepted_before is not None:
                    level["verification"] = acceptance_level(accepted_before, totals())
                if n == 1:
                    for i, run in enumerate(runs):
                        if not isinstance(run, BaseException):
                            alone[streams[i % len(streams)][0]] = signature(run.events)
                levels.append(level)
                print(level_line(level), flush=True)
                bar.update(1)
        # After the levels: the seam's counters (prefix-cache hits) cover the whole run. `scheduler` is
        # the first engine's (the only one, unless `engines` asked for more); `per_engine` lists them all.
        per_engine = engine_stats(handle)
        facts = {"seam_describe": describe() if callable(describe) else None,
                 "max_batch": engine.scheduler.max_batch, "scheduler": per_engine[0], "per_engine": per_engine}
        heads = [[h.layer, h.head] for h in engine.heads]
    return {"levels": levels, "engine": facts, "heads": heads, "seam_options": route.seam_options,
            "alone": {name: {str(seq): list(sig) for seq, sig in sigs.items()} for name, sigs in alone.items()}}


def _profiled_engines(options: LoadOptions, mode: str | None, engines: list) -> dict[str, Any]:
    """The engines to profile over each level, by file name stem ({} without engine_profile_dir)."""
    if not options.engine_profile_dir:
        return {}
    label = (mode or options.seam).replace("+", "_")
    seams = {f"{label}_engine{e.name}": e.seam for e in engines if callable(getattr(e.seam, "profile", None))}
    if not seams:
        raise AlignattError(f"engine_profile_dir: configuration {mode or options.seam!r} has no engine in a process "
                            "of its own to profile (set own_process=true or engines=N)")
    return seams


def configuration_in_child(payload: dict) -> dict:
    """`run_configuration` for `alignatt.record.isolated` (payload: options and configuration)."""
    return run_configuration(LoadOptions.model_validate(payload["options"]),
                             LoadConfiguration.model_validate(payload["configuration"]))


def capture_cost_in_child(payload: dict) -> list[dict]:
    from alignatt.core.draft import Head
    from alignatt.measure.capture_cost import capture_cost

    options = LoadOptions.model_validate(payload["options"])
    configuration = LoadConfiguration.model_validate(payload["configuration"])
    if options.profile_dir:  # a folder per configuration, named by its label
        options = options.model_copy(update={"profile_dir": str(Path(options.profile_dir) /
                                                                 str(configuration.label()).replace("+", "_"))})
    return capture_cost(options, [Head(int(a), int(b)) for a, b in payload["heads"]],
                        seam_options=configuration.seam_options())


def verify_equality_in_child(payload: dict) -> dict:
    """`verified_against_scratch` on the bench prompts, on one engine of the payload's configuration
    (its engine flags, verification on; its server flags do not change the engine)."""
    from alignatt.capture.registry import make_seam
    from alignatt.checks.records import bench_requests
    from alignatt.core.draft import Head
    from alignatt.measure.verify_equality import verified_against_scratch

    options = LoadOptions.model_validate(payload["options"])
    configuration = LoadConfiguration.model_validate(payload["configuration"])
    heads = [Head(int(a), int(b)) for a, b in payload["heads"]]
    requests = [r for _, r in bench_requests(options.capture_cost_tokens)]
    seam = make_seam(VLLM_CAPTURE, model=options.model, heads=heads, device=options.device, dtype=options.dtype,
                     max_num_seqs=len(requests),  # drafts end as served ones do
                     **{"vllm_mode": "cudagraph", **configuration.seam_options()})
    try:
        return verified_against_scratch(seam, requests, decision_heads=len(heads))
    finally:
        seam.close()


def run_load(options: LoadOptions, out: str | Path | None = "outputs/load.json", metrics: str | Path | None = None,
             plot: str | Path | None = None, seam_factory=None):
    """Every configuration's load levels on a loopback server, then the capture cost; writes the
    artifact (and metrics/plot) once all of it is measured."""
    from alignatt.record.artifacts import (ARTIFACT_SCHEMA_VERSION, CaptureCostRow, LoadArtifact, LoadLevel,
                                           LoadRecord, VerifyEquality, write_artifact)
    from alignatt.record.isolated import run_in_child
    from alignatt.record.provenance import collect_provenance, model_identity
    from alignatt.serve.config import resolve_heads, resolve_preset
    from alignatt.serve.protocol import ProtocolError

    try:
        preset = resolve_preset(options.preset).name
    except ProtocolError as e:
        raise AlignattError(e.message) from None
    streams = resolve_streams(options.streams)
    configurations = options.runs()
    modes = [c.label() for c in configurations]  # their names in the artifact and on the page
    want_cost = options.capture_cost == "on" or (
        options.capture_cost == "auto" and options.seam == VLLM_CAPTURE and options.device.startswith("cuda"))
    # One vLLM engine per process: with a second one to come (another mode, the capture cost), each
    # configuration runs in a child of its own.
    isolate = seam_factory is None and options.seam == VLLM_CAPTURE and (len(configurations) > 1 or want_cost)
    runs: list[dict] = []
    ran: list[LoadConfiguration] = []  # the artifact holds what ran; what did not is named in `failed`
    failed: list[str] = []
    for i, configuration in enumerate(configurations):
        levels = options if i == 0 else options.for_later_configurations()
        payload = {"options": levels.model_dump(), "configuration": configuration.model_dump()}
        try:
            runs.append(run_in_child("alignatt.measure.capacity:configuration_in_child", payload,
                                     f"load ({configuration.label()})")
                        if isolate else run_configuration(levels, configuration, seam_factory))
        except Exception as e:  # noqa: BLE001 - a later isolated configuration's failure is recorded, not raised
            if i == 0 or not isolate:  # the first is the one the others are compared with
                raise
            failed.append(f"{configuration.label()}: {type(e).__name__}: {_first_line(e)}")
            print(f"load ({configuration.label()}) failed: {e}", file=sys.stderr, flush=True)
            continue
        ran.append(configuration)
    configurations, modes = ran, [c.label() for c in ran]
    for r in runs[1:]:  # one speaker alone on each later configuration against the first
        difference = configuration_difference(runs[0]["alone"], r["alone"])
        for lv in r["levels"]:
            if lv["speakers"] == 1:
                lv.update(difference)
    levels = [lv for r in runs for lv in r["levels"]]
    cost: list[dict] = []
    heads = runs[0]["heads"] or [[h.layer, h.head] for h in resolve_heads(_route(options, configurations[0]), "en-de")]
    # The capture cost drafts fixed-length tokens with no proposal, on one engine: verification and
    # engine processes change nothing it measures, so each configuration is measured without them, once
    # (the seam's default mode: cudagraph).
    engines = list(dict.fromkeys(c.plain_engine() for c in configurations))
    if want_cost:
        for engine in engines:
            engine = engine if engine.vllm_mode else engine.model_copy(update={"vllm_mode": "cudagraph"})
            payload = {"options": options.model_dump(), "configuration": engine.model_dump(), "heads": heads}
            rows = (run_in_child("alignatt.measure.capacity:capture_cost_in_child", payload,
                                 f"capture cost ({engine.label()})")
                    if seam_factory is None else capture_cost_in_child(payload))
            cost += [{**row, "vllm_mode": engine.label()} for row in rows]
        skipped = [c for c in configurations if c not in engines]
        note = (f"draft_many of the bench prompts, {options.capture_cost_tokens} fixed-length tokens, "
                f"median of {options.capture_cost_repeats} after a warm-up, capture on then off, one engine at a time"
                + (f"; not measured for {', '.join(str(c.label()) for c in skipped)}: these drafts carry no proposal "
                   f"to verify and run on one engine, as "
                   f"{', '.join(dict.fromkeys(str(c.plain_engine().label()) for c in skipped))} does"
                   if skipped else ""))
    else:
        note = "not measured: needs vllm_capture on CUDA (capture_cost=on forces it)"
    # Verified re-drafts against drafting from scratch on the bench prompts, per verify configuration.
    # A failure there is recorded, not raised: the levels measured before it are the run's result.
    equality: list[dict] = []
    equality_failed: list[str] = []
    want_equality = options.seam == VLLM_CAPTURE and options.device.startswith("cuda")
    for configuration in (c for c in configurations if want_equality and c.verify):
        mode = configuration.label()
        payload = {"options": options.model_dump(), "configuration": configuration.model_dump(), "heads": heads}
        try:
            got = (run_in_child("alignatt.measure.capacity:verify_equality_in_child", payload,
                                f"verify equality ({mode})") if seam_factory is None else verify_equality_in_child(payload))
        except Exception as e:  # noqa: BLE001 - said in the artifact and on stderr
            equality_failed.append(f"{mode}: {type(e).__name__}: {_first_line(e)}")
            print(f"verify equality ({mode}) failed: {e}", file=sys.stderr, flush=True)
            continue
        equality.append({**got, "vllm_mode": mode})
    engine_facts = {**runs[0]["engine"], **({"engines_by_configuration": {
        str(m): r["engine"] for m, r in zip(modes, runs)}} if len(modes) > 1 else {})}
    try:
        model_id, revision = model_identity(options.model)
    except Exception:  # noqa: BLE001 - identity is best effort (a local path without metadata)
        model_id, revision = options.model, None
    model_preset = preset_for(options.model)
    synthetic = bool((engine_facts.get("seam_describe") or {}).get("synthetic_weights")) or bool(
        model_preset and model_preset.synthetic_weights)
    artifact = LoadArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=collect_provenance(model_id=model_id, model_revision=revision),
        config=LoadRecord(
            **options.model_dump(exclude={"configurations", "preset", "speakers", "streams"}), preset=preset,
            speakers=sorted(set(options.speakers)), streams=[s for s, _ in streams],
            vllm_modes=modes,  # the configurations by label (load_configurations.py reads them back)
            engine_heads=heads, stream_words={s: len(st.words) for s, st in streams},
            stream_seconds={s: round(len(st.words) / st.words_per_second + st.commit_lag_seconds, 1)
                            for s, st in streams},
            seam_options=runs[0]["seam_options"], lag_growth_threshold_s=LAG_GROWTH_S, **engine_facts,
        ),
        synthetic_weights=synthetic,
        levels=[LoadLevel(**lv) for lv in levels],
        capture_cost=[CaptureCostRow(**c) for c in cost],
        capture_cost_note=note,
        verify_equality=[VerifyEquality(**e) for e in equality],
        verify_equality_note="; ".join(f"failed for {f}" for f in equality_failed),
        configurations_failed=failed,
    )
    if out is not None:
        write_artifact(out, artifact)
    if metrics is not None:
        write_metrics(metrics, artifact)
    if plot is not None:
        write_plot(plot, artifact)
    return artifact


def _first_line(error: Exception) -> str:
    return str(error).splitlines()[0][:300] if str(error) else ""


def write_metrics(path: str | Path, artifact) -> None:
    """DVC metrics: the headline figures per load level (and the capture cost ratios)."""
    data: dict[str, Any] = {}
    several = len({lv.vllm_mode for lv in artifact.levels}) > 1
    for lv in artifact.levels:
        where = data.setdefault(str(lv.vllm_mode), {}) if several else data
        where[f"speakers_{lv.speakers}"] = {
            "partial_rtt_ms_p50": lv.partial_rtt_ms_p50, "partial_rtt_ms_p95": lv.partial_rtt_ms_p95,
            "partial_rtt_ms_p99": lv.partial_rtt_ms_p99, "final_rtt_ms_p95": lv.final_rtt_ms_p95,
            "lag_s_max": lv.lag_s_max, "lag_grows": lv.lag_grows, "retractions": lv.retractions,
            "finals_in_order": lv.finals_in_order, "error_frames": lv.error_frames,
        }
    if artifact.capture_cost:
        for c in artifact.capture_cost:
            where = data.setdefault(str(c.vllm_mode), {}) if several else data
            where.setdefault("capture_cost_ratio", {})[f"batch_{c.batch}"] = c.ratio
    _atomic_write(path, json.dumps(data, indent=1) + "\n")


def write_plot(path: str | Path, artifact) -> None:
    """Plot data: RTT against speakers, one row per level (`dvc plots show`)."""
    from io import StringIO

    buf = StringIO()
    w = csv.writer(buf)
    w.writerow(["speakers", "configuration", "partial_rtt_ms_p50", "partial_rtt_ms_p95", "partial_rtt_ms_p99",
                "lag_s_max"])
    for lv in artifact.levels:
        w.writerow([lv.speakers, f"{artifact.config.seam}/{lv.vllm_mode or 'default'}", lv.partial_rtt_ms_p50, lv.partial_rtt_ms_p95, lv.partial_rtt_ms_p99,
                    lv.lag_s_max])
    _atomic_write(path, buf.getvalue())


def _atomic_write(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
