"""core and the CLI's entry import without torch: every `alignatt` process, `--help` included,
would otherwise pay about 5 s for it."""

from __future__ import annotations

import subprocess
import sys


def test_core_and_the_cli_import_without_torch():
    code = ("import sys, alignatt.core.draft, alignatt.core.policy, alignatt.core.settle, alignatt.cli.app; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
