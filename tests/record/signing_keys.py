"""Throwaway SSH keys for tests of run records, and a helper that signs a test tree's files at import."""

from __future__ import annotations

from pathlib import Path

from alignatt.record.importing import attest_imported
from alignatt.record.signing import ALLOWED_SIGNERS, SigningKey, allowed_signers_line, generate_key


def throwaway_key(folder: Path, principal: str) -> SigningKey:
    return generate_key(folder / principal / "key", principal)


def trust(root: Path, key: SigningKey) -> None:
    """Add the key to the tree's committed trusted keys."""
    allowed = root / ALLOWED_SIGNERS
    allowed.parent.mkdir(parents=True, exist_ok=True)
    with open(allowed, "a", encoding="utf-8") as f:
        f.write(allowed_signers_line(key))


def attest_tree(root: Path, key: SigningKey) -> None:
    """Import-sign every folder under the tree's outputs/ (the tree is not a git checkout)."""
    folders = sorted(p for p in (root / "outputs").iterdir() if p.is_dir() and p.name != "run-records")
    attest_imported(root, folders, key)
