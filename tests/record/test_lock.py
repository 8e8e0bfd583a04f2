"""The lock an environment was installed from, and its drift, as provenance records them."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from alignatt.record.lock import drift, installed_lock, pins

ROOT = Path(__file__).resolve().parents[2]


def test_pins_reads_name_and_version_of_a_hashed_lock():
    text = "foo-bar==1.2 \\\n    --hash=sha256:ab\n    # via x\nBaz_Q==2.0+cpu ; python_version>'3'\n"
    assert pins(text) == {"foo-bar": "1.2", "baz-q": "2.0+cpu"}


def test_drift_names_what_the_environment_does_not_match():
    import pydantic

    text = f"pydantic=={pydantic.VERSION}\nnot-a-package-here==1.0\npytest==0.0.1\n"
    assert drift(text) == ["not-a-package-here: 1.0 != not installed",
                           f"pytest: 0.0.1 != {__import__('pytest').__version__}"]


def test_installed_lock_follows_the_env_variable(tmp_path, monkeypatch):
    lock = tmp_path / "x.txt"
    lock.write_text("pytest==0.0.1\n")
    monkeypatch.setenv("ALIGNATT_LOCK", str(lock))
    state = installed_lock()
    assert state.sha256 == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert [d.split(":")[0] for d in state.differing] == ["pytest"]


def test_the_committed_locks_pin_the_stacks_the_project_names():
    cpu = pins((ROOT / "requirements/cpu.txt").read_text())
    gpu = pins((ROOT / "requirements/gpu.txt").read_text())
    assert cpu["torch"].endswith("+cpu") and cpu["transformers"] == "5.13.1"
    assert (gpu["vllm"], gpu["torch"], gpu["transformers"]) == ("0.22.1", "2.11.0", "5.13.1")


def test_make_install_records_the_lock_it_installed():
    if not (Path(sys.prefix) / "alignatt-lock.txt").exists():
        import pytest

        pytest.skip("this environment was not installed by `make install`")
    state = installed_lock(ROOT)
    assert state is not None and state.path.startswith("requirements/")
