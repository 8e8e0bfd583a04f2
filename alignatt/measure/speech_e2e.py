"""`alignatt speech-e2e`: the user's real-speech path end to end, written down as an artifact.

`alignatt serve` (served defaults for the model and device, `server_config` as the CLI builds it)
and the unmodified `whisperlivekit-server` (faster-whisper under LocalAgreement, `--translation-
backend alignatt` at a relay in front of our server, `speech/wlk_server.py`) start side by side;
the clip is fed as PCM through WhisperLiveKit's own WebSocket at `speed` x real time; both servers
stop (process groups, killed if they do not stop: no orphans, on failure too); the relay's frames
and WhisperLiveKit's shown messages are measured (`speech/end_to_end.py`) into a `speech_e2e`
artifact. The recogniser runs on the CPU (CUDA hidden from WhisperLiveKit's process): on a GPU host
it takes the host's cores and leaves the GPU to the MT server. Nothing is downloaded: the clip and
tiny.en come from packages, the warm-up file is the clip itself, the hub is offline.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from alignatt.core.errors import AlignattError
from alignatt.measure.server_process import ServerProcess, free_port, http_json, kill_group
from alignatt.measure.smoke import percentile
from alignatt.record.artifacts.speech import E2EClip, E2EServed, E2EWord, SpeechE2EArtifact, SpeechE2EOptions
from alignatt.speech.recognise import SAMPLE_RATE

# the offline environment both servers run in: nothing from the hub
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class ClipInput:
    path: Path
    facts: E2EClip
    transcript: str | None
    no_transcript: str | None  # why there is no WER


def clip_input(clip: str) -> ClipInput:
    """A packaged clip (fetched and checked) or a user's audio file; AlignattError for neither."""
    from alignatt.record.digest import sha256_file
    from alignatt.speech.clips import CLIPS, fetch, transcript

    if clip in CLIPS:
        c = CLIPS[clip]
        path = fetch(clip)
        text = transcript(clip)
        return ClipInput(path, E2EClip(name=clip, package=c.package, seconds=c.seconds, sha256=c.sha256,
                                       licence=c.licence), text,
                         None if text else f"{c.package} ships no transcript of {clip}")
    path = Path(clip)
    if not path.is_file():
        raise AlignattError(f"unknown clip {clip!r}: not a packaged clip ({', '.join(CLIPS)}) nor an audio file")
    return ClipInput(path, E2EClip(name=path.stem, path=str(path), seconds=0.0, sha256=sha256_file(path)), None,
                     "a user's audio file: no transcript")


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _wait_health(servers: list[tuple[str, subprocess.Popen, int, Path]], deadline: float) -> None:
    """Until every server's `/health` answers 200; one line naming the first that exits or is late."""
    waiting = list(servers)
    while waiting:
        for server in list(waiting):
            what, process, port, log = server
            if process.poll() is not None:
                raise AlignattError(f"{what} exited ({process.returncode}) before listening: {_tail(log)} (log: {log})")
            try:
                if http_json(port, "/health", timeout=2)[0] == 200:
                    waiting.remove(server)
            except (OSError, ValueError):
                pass
        if waiting and time.monotonic() > deadline:
            what, _, _, log = waiting[0]
            raise AlignattError(f"{what} was not listening within the start timeout (log: {log})")
        time.sleep(0.5)


def _stop_group(process: subprocess.Popen, seconds: float = 20.0) -> None:
    """SIGTERM the process group, SIGKILL it past `seconds`; then SIGKILL whatever of the group is left."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(seconds)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        pass
    kill_group(process)


@dataclass
class Servers:
    asr_url: str  # WhisperLiveKit's /asr WebSocket
    relay: object  # speech.wlk_server.Relay: every frame between the two servers
    wlk_command: list[str]
    served: E2EServed


@contextmanager
def running_servers(options: SpeechE2EOptions, warmup: Path, workdir: Path) -> Iterator[Servers]:
    """`alignatt serve` and `whisperlivekit-server` in front of it through a relay, listening; both
    stopped on the way out, whatever happened (their process groups, killed past a grace period)."""
    from alignatt.serve.config import server_config
    from alignatt.speech.recognise import model_dir
    from alignatt.speech.wlk_server import Relay, wlk_server_command

    asr_dir = model_dir(options.asr_model)
    mt_port, wlk_port = free_port(), free_port()
    cfg = server_config(model=options.model, seam=options.seam, device=options.device, dtype=options.dtype,
                        port=mt_port)
    route = next(iter(cfg.directions.values()))
    served = E2EServed(model=route.model, seam=route.seam, device=route.device, dtype=route.dtype,
                       seam_options=route.seam_options, settle_buffer_tokens=cfg.settle_buffer_tokens,
                       engine_process=cfg.replicas.own_process)
    deadline = time.monotonic() + options.start_timeout_s
    wlk_env = {**os.environ, **OFFLINE, "HF_HOME": str(workdir / "hf"), "XDG_CACHE_HOME": str(workdir / "cache"),
               "CUDA_VISIBLE_DEVICES": ""}  # the recogniser on the CPU cores; the GPU is the MT server's
    mt = wlk = None
    try:
        with Relay(f"ws://127.0.0.1:{mt_port}") as relay:
            command = wlk_server_command(wlk_port, relay.url, asr_dir, warmup)
            mt = ServerProcess(cfg.model_dump(mode="json"), workdir, None, options.start_timeout_s,
                               name="alignatt-serve", env=OFFLINE)
            log = workdir / "whisperlivekit.log"
            with log.open("w") as out:  # a file: a full pipe would block the server
                wlk = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       env=wlk_env, cwd=workdir)
            # loaded side by side; whichever fails first is named
            _wait_health([("whisperlivekit-server", wlk, wlk_port, log),
                          ("alignatt serve", mt.process, mt_port, mt.log)], deadline)
            yield Servers(f"ws://127.0.0.1:{wlk_port}/asr", relay, command, served)
    finally:
        if wlk is not None:
            _stop_group(wlk)
        if mt is not None:
            mt.stop()  # SIGTERM: it drains and stops its engines; killed past a minute
            kill_group(mt.process)  # whatever of its process group is left


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def run_speech_e2e(options: SpeechE2EOptions, out: str | Path) -> SpeechE2EArtifact:
    """Run the path once and write its artifact to `out` (atomically; nothing on failure)."""
    from websockets.exceptions import WebSocketException

    from alignatt.record.artifacts import ARTIFACT_SCHEMA_VERSION, write_artifact
    from alignatt.record.provenance import collect_provenance, model_identity
    from alignatt.speech.end_to_end import measure
    from alignatt.speech.recognise import committed_wer, load_audio, model_dir
    from alignatt.speech.wlk_server import feed_pcm, wlk_server_exe

    clip = clip_input(options.clip)
    model_dir(options.asr_model)  # before any server starts: a missing recogniser is one line
    wlk_server_exe()
    audio = load_audio(clip.path)
    facts = clip.facts.model_copy(update={"seconds": round(len(audio) / SAMPLE_RATE, 3)})
    workdir = Path(tempfile.mkdtemp(prefix="alignatt-speech-e2e-"))  # the servers' logs: kept on failure
    with running_servers(options, clip.path, workdir) as servers:
        try:
            fed = feed_pcm(servers.asr_url, audio, options.chunk_s, options.speed, options.timeout_s)
        except (AlignattError, OSError, WebSocketException) as e:  # e.g. WhisperLiveKit closed on us
            said = str(e) if isinstance(e, AlignattError) else f"feeding WhisperLiveKit failed: {type(e).__name__}: {e}"
            raise AlignattError(f"{said} (the servers' logs: {workdir})") from None
        frames = list(servers.relay.frames)
    run = measure(frames, fed.shown, fed.began - servers.relay.began, options.speed)
    words = [w for w, _, _ in run.words]
    model_id, revision = model_identity(options.model)
    artifact = SpeechE2EArtifact(
        schema_version=ARTIFACT_SCHEMA_VERSION,
        provenance=collect_provenance(model_id=model_id, model_revision=revision),
        config=options, clip=facts, whisperlivekit=_version("whisperlivekit"),
        recogniser=(f"faster-whisper {_version('faster-whisper')} {options.asr_model} under WhisperLiveKit's "
                    "LocalAgreement, on the CPU (CUDA hidden from whisperlivekit-server)"),
        wlk_command=servers.wlk_command, served=servers.served, wall_s=fed.wall_s,
        updates=run.updates, replies=len(run.replies), replies_with_committed_text=run.replies_with_committed_text,
        finals=run.finals, error_frames=len(run.errors), error_codes=sorted(set(run.errors)),
        rtt_ms_p50=percentile(run.rtt_ms, 0.5), rtt_ms_p95=percentile(run.rtt_ms, 0.95),
        source_retractions=run.source_retractions, transcript_retractions=run.transcript_retractions,
        translation_retractions=run.translation_retractions,
        committed_words=len(run.words), words_never_covered=run.never_covered,
        caption_delay_s_p50=percentile(run.delays_s, 0.5), caption_delay_s_p95=percentile(run.delays_s, 0.95),
        shown_messages=len(fed.shown), shown_translations=run.shown_translations,
        wer_committed=committed_wer(words, clip.transcript) if clip.transcript and words else None,
        wer_reason=clip.no_transcript if not clip.transcript else (None if words else "no word was committed"),
        words=[E2EWord(word=w, end_s=end, covered_s=covered) for w, end, covered in run.words],
        events=run.events,
    )
    write_artifact(out, artifact)
    shutil.rmtree(workdir, ignore_errors=True)
    return artifact


def summary_line(a: SpeechE2EArtifact) -> str:
    return (f"{a.clip.name} at {a.config.speed:g}x: {a.replies_with_committed_text} replies with committed text, "
            f"{a.committed_words} words committed ({a.words_never_covered} never covered), retractions "
            f"{a.source_retractions}/{a.transcript_retractions}/{a.translation_retractions} (source/transcript/"
            f"translation), caption delay p50 {a.caption_delay_s_p50} s / p95 {a.caption_delay_s_p95} s (audio "
            f"clock), RTT p50 {a.rtt_ms_p50} ms / p95 {a.rtt_ms_p95} ms, errors {a.error_frames}, WER "
            f"{a.wer_committed if a.wer_committed is not None else a.wer_reason}")
