"""The user's path, end to end: WhisperLiveKit's own server (unmodified) hears a clip and asks
`alignatt serve` for its translations.

`wlk_server_command` is the command line a user runs: faster-whisper under the LocalAgreement
policy on a CTranslate2 model directory (the packaged tiny.en by default), PCM over the WebSocket,
a local warm-up file (WhisperLiveKit's default warm-up downloads one), and `--translation-backend
alignatt` at our server. `Relay` sits between the two servers on loopback and keeps every protocol
frame they exchange, so what WhisperLiveKit committed and what our server answered can be checked
word by word. `feed_pcm` plays audio into WhisperLiveKit's `/asr` WebSocket as a browser does
(16-bit PCM pieces, each sent once it would have been spoken, at a chosen speed) and keeps every
message it shows. `alignatt speech-e2e` (measure/speech_e2e.py) runs the two servers and measures.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from alignatt.core.errors import AlignattError
from alignatt.speech.recognise import SAMPLE_RATE

BYTES_PER_SAMPLE = 2  # s16le, what `--pcm-input` takes
WLK_SERVER_HINT = "pip install 'alignatt[wlk-server]' and pip install --no-deps whisperlivekit==0.2.26"


def wlk_server_exe() -> str:
    """`whisperlivekit-server` beside this interpreter (the venv's), else on PATH."""
    exe = shutil.which("whisperlivekit-server", path=str(Path(sys.executable).parent)) or shutil.which(
        "whisperlivekit-server")
    if exe is None:
        raise AlignattError(f"whisperlivekit-server is not installed: {WLK_SERVER_HINT}")
    return exe


def wlk_server_command(port: int, alignatt_url: str, model_dir: Path, warmup_file: Path,
                       source_lang: str = "en", target_lang: str = "de") -> list[str]:
    """`whisperlivekit-server` as a user starts it in front of `alignatt serve` (no download: the
    model is a local CTranslate2 directory, the warm-up a local file)."""
    return [wlk_server_exe(), "--host", "127.0.0.1", "--port", str(port),
            "--backend", "faster-whisper", "--backend-policy", "localagreement",
            "--model_dir", str(model_dir), "--pcm-input", "--warmup-file", str(warmup_file),
            "--lan", source_lang, "--target-language", target_lang,
            "--translation-backend", "alignatt", "--alignatt-url", alignatt_url]


@dataclass
class Frame:
    t: float  # seconds since the relay started
    direction: str  # "up" (WhisperLiveKit -> alignatt) or "down"
    data: dict
    connection: int = 0  # which of WhisperLiveKit's connections to the relay (a reconnect opens another)


@dataclass
class Relay:
    """A loopback WebSocket relay to `upstream` that keeps every JSON frame both ways."""

    upstream: str
    frames: list[Frame] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self.began = time.monotonic()  # the frames' clock starts here
        self._connections = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wlk-relay", daemon=True)

    def __enter__(self) -> "Relay":
        self._thread.start()
        if not self._ready.wait(10):
            raise AlignattError("the relay did not start")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def _keep(self, direction: str, message, connection: int) -> None:
        try:
            self.frames.append(Frame(round(time.monotonic() - self.began, 3), direction, json.loads(message),
                                     connection))
        except (TypeError, ValueError):
            pass

    async def _pipe(self, source, sink, direction: str, connection: int) -> None:
        async for message in source:
            self._keep(direction, message, connection)
            await sink.send(message)

    async def _handle(self, client) -> None:
        from websockets.asyncio.client import connect

        connection = self._connections
        self._connections += 1
        async with connect(self.upstream, max_size=None) as server:
            pipes = [asyncio.create_task(self._pipe(client, server, "up", connection)),
                     asyncio.create_task(self._pipe(server, client, "down", connection))]
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            for p in pipes:
                p.cancel()

    async def _serve(self) -> None:
        from websockets.asyncio.server import serve

        self._stop = asyncio.Event()
        async with serve(self._handle, "127.0.0.1", 0, max_size=None) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())


def pcm16(audio: np.ndarray) -> bytes:
    """float32 in [-1, 1] as the s16le bytes WhisperLiveKit's `--pcm-input` takes."""
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()


@dataclass
class Fed:
    began: float  # time.monotonic() when the feed began (the audio's clock: 0 here)
    shown: list[dict]  # every message WhisperLiveKit showed, `t`: seconds since `began`
    wall_s: float  # `began` to WhisperLiveKit's ready_to_stop


async def _feed(url: str, pcm: bytes, chunk_s: float, speed: float, timeout_s: float) -> Fed:
    from websockets.asyncio.client import connect

    shown: list[dict] = []
    step = int(chunk_s * SAMPLE_RATE) * BYTES_PER_SAMPLE
    bytes_per_s = SAMPLE_RATE * BYTES_PER_SAMPLE * speed  # the audio's clock, at `speed`
    async with connect(url, max_size=None) as ws:
        config = json.loads(await ws.recv())
        if not config.get("useAudioWorklet"):
            raise AlignattError("WhisperLiveKit does not take PCM: start it with --pcm-input")
        began = time.monotonic()

        async def send() -> None:
            # a piece goes once its last sample would have been spoken (a microphone's pace), on a
            # fixed schedule so that sending never drifts the audio's clock
            for i in range(0, len(pcm), step):
                piece = pcm[i:i + step]
                await asyncio.sleep(max(0.0, began + (i + len(piece)) / bytes_per_s - time.monotonic()))
                await ws.send(piece)
            await ws.send(b"")  # end of audio

        sender = asyncio.create_task(send())
        deadline = began + len(pcm) / bytes_per_s + timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AlignattError(f"WhisperLiveKit did not finish within {timeout_s:.0f} s of the audio's end")
                try:
                    message = json.loads(await asyncio.wait_for(ws.recv(), left))
                except asyncio.TimeoutError:
                    continue  # the deadline says so above
                if message.get("type") == "ready_to_stop":
                    break
                shown.append({"t": round(time.monotonic() - began, 3), **message})
            await sender
        finally:
            sender.cancel()
    return Fed(began, shown, round(time.monotonic() - began, 3))


def feed_pcm(url: str, audio: np.ndarray, chunk_s: float = 0.5, speed: float = 1.0,
             timeout_s: float = 120.0) -> Fed:
    """Play `audio` (16 kHz mono float32) into WhisperLiveKit's `/asr` at `speed` x real time; every
    message it showed until it said `ready_to_stop`."""
    return asyncio.run(_feed(url, pcm16(audio), chunk_s, speed, timeout_s))
