"""The WhisperLiveKit client (`whisperlivekit.translation_alignatt`), loaded unmodified.

WhisperLiveKit's package `__init__` imports its whole audio/ASR stack (faster-whisper, fastapi,
torchaudio...), but the alignatt client module needs only `websockets` and the package's
`timed_objects` dataclasses. Installed with `pip install --no-deps whisperlivekit==0.2.26`, the
two modules are imported from the package's own files, unchanged, without running `__init__`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from alignatt.core.errors import AlignattError

WLK_VERSION = "0.2.26"
WLK_INSTALL_HINT = f"pip install --no-deps whisperlivekit=={WLK_VERSION}"


def load_wlk_client() -> types.ModuleType:
    """`whisperlivekit.translation_alignatt` without running the package's `__init__`.

    The package's `__init__` imports its audio/ASR stack (numpy audio processing, faster-whisper,
    fastapi...); the client module itself needs only `websockets` and the package's
    dataclasses. So when the package is installed (`pip install --no-deps whisperlivekit`) but
    not importable as a whole, register a bare package object for its directory and import just
    the two modules from their files, unchanged.
    """
    if "whisperlivekit.translation_alignatt" in sys.modules:
        return sys.modules["whisperlivekit.translation_alignatt"]
    spec = importlib.util.find_spec("whisperlivekit")
    if spec is None or not spec.submodule_search_locations:
        raise AlignattError(f"the WhisperLiveKit client is not installed: {WLK_INSTALL_HINT}")
    if "whisperlivekit" not in sys.modules:
        package = types.ModuleType("whisperlivekit")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__file__ = spec.origin
        sys.modules["whisperlivekit"] = package
    try:
        return importlib.import_module("whisperlivekit.translation_alignatt")
    except ImportError as e:  # another release without the module, or `websockets` missing
        raise AlignattError(f"the WhisperLiveKit client cannot be imported ({e}): {WLK_INSTALL_HINT}") from None


def wlk_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("whisperlivekit")
    except PackageNotFoundError:
        return None


def wlk_available() -> bool:
    try:
        load_wlk_client()
        return True
    except Exception:
        return False
