"""Checks a command makes before it loads a model or measures anything.

Each raises `AlignattError` (one line, exit code 2 through the app's error rule), so a typo, a busy
port or an unwritable output fails in a second instead of after minutes of loading or measuring.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from alignatt.core.errors import AlignattError


def check_served_model(model: str, seam: str, heads: str | None = None, direction: str = "en-de") -> None:
    """The model name, the seam name and the head set (given, or the model's default) all exist."""
    from alignatt.capture.names import SEAMS
    from alignatt.heads.sets import default_head_set, load_head_set
    from alignatt.models.presets import check_model_name

    if seam not in SEAMS:
        raise AlignattError(f"unknown seam {seam!r}: use one of {', '.join(SEAMS)}")
    check_model_name(model)  # before the head lookup, so an unknown model says so
    if heads:
        load_head_set(heads)
    else:
        default_head_set(model, direction)


def check_port_free(host: str, port: int) -> None:
    """Bind the port once and release it: a port in use fails here, not after the model loads.

    SO_REUSEADDR as the server's own listener sets it, so a port left in TIME_WAIT is not called busy."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        if os.name != "nt":
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            why = "is already in use" if e.errno == errno.EADDRINUSE else f"cannot be bound: {e.strerror or e}"
            raise AlignattError(f"cannot listen on {host}:{port} (port {port} {why})") from None


def check_output(path: str | Path | None, option: str = "--out") -> None:
    """`path` can be written: its folder exists, or can be made, and is writable.

    Artifact writers make missing folders, so a missing folder under a writable one is fine; a
    folder that cannot be made (a file in the way, no permission) fails before any measuring."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise AlignattError(f"{option} {path} is a folder: give a file path")
    folder = target.parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise AlignattError(f"{option} {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise AlignattError(f"{option} {path}: folder {existing} is not writable")


def check_existing_output(path: str | Path, option: str = "--out") -> None:
    """`path` exists: what --add adds to."""
    if not Path(path).is_file():
        raise AlignattError(f"{option} {path} does not exist: nothing to add to (run without --add first)")


def check_served(cfg) -> None:  # noqa: ANN001 - a ServerConfig (its import loads the serve package)
    """`alignatt serve`'s checks: the port (first: it takes no imports), then every route's model,
    seam and head set."""
    check_port_free(cfg.host, cfg.port)
    for direction, route in cfg.directions.items():
        check_served_model(route.model, route.seam, route.heads, direction)
