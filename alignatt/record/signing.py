"""SSH signatures of run records: `ssh-keygen -Y sign` on the measuring host, `-Y verify` in the audit.

A run record is signed with an SSH key of the host that measured it. Which key, on a host:
`ALIGNATT_SIGNING_KEY` (a path to an OpenSSH private key), else `keys/private/signing_key` in the
checkout (git-ignored; `alignatt attest --new-key` makes one). The trusted public keys are the
committed `keys/allowed_signers` (OpenSSH's allowed-signers format: `principal
namespaces="alignatt-run-record" ssh-ed25519 AAAA...`), plus any file an audit is given with
`--trust` for that audit only (a CI run's ephemeral key). Every signature uses one namespace, so a
key's signature over anything else (a git commit, a file) cannot pass as a run record's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from alignatt.core.errors import AlignattError

NAMESPACE = "alignatt-run-record"
SIGNING_KEY_ENV = "ALIGNATT_SIGNING_KEY"
DEFAULT_KEY = Path("keys/private/signing_key")  # relative to the checkout; git-ignored
ALLOWED_SIGNERS = Path("keys/allowed_signers")  # committed: the trusted public keys
TIMEOUT_S = 30


def ssh_keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise AlignattError("ssh-keygen not found: run records are signed and checked with it "
                            "(Debian: apt-get install openssh-client)")
    return found


def _run(args: list[str], stdin: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([ssh_keygen(), *args], input=stdin, capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AlignattError(f"ssh-keygen {args[0]} {args[1]} took over {TIMEOUT_S} s") from None


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr or done.stdout or b"").decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


@dataclass(frozen=True)
class SigningKey:
    path: Path
    principal: str  # the name it goes by in allowed_signers
    fingerprint: str  # "SHA256:..." of its public half

    def sign(self, data_file: Path) -> Path:
        """Write `<data_file>.sig` (an SSH signature over the file's bytes); its path."""
        sig = data_file.with_name(data_file.name + ".sig")
        sig.unlink(missing_ok=True)  # ssh-keygen will not overwrite
        done = _run(["-Y", "sign", "-q", "-f", str(self.path), "-n", NAMESPACE, str(data_file)])
        if done.returncode != 0 or not sig.exists():
            raise AlignattError(f"could not sign {data_file} with {self.path}: {_last_line(done)}")
        return sig


def key_fingerprint(key: Path) -> tuple[str, str]:
    """(SHA256 fingerprint, comment) of a private or public key file."""
    done = _run(["-l", "-E", "sha256", "-f", str(key)])
    if done.returncode != 0:
        raise AlignattError(f"{key}: not an SSH key ({_last_line(done)})")
    parts = done.stdout.decode().split()  # "256 SHA256:xxx comment (ED25519)"
    return parts[1], " ".join(parts[2:-1])


def signing_key_path(root: Path) -> Path | None:
    """The configured signing key: $ALIGNATT_SIGNING_KEY, else the checkout's default; None if neither."""
    named = os.environ.get(SIGNING_KEY_ENV)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise AlignattError(f"{SIGNING_KEY_ENV}={named}: no such key file")
        return path
    default = root / DEFAULT_KEY
    return default if default.is_file() else None


def load_signing_key(path: Path) -> SigningKey:
    """The key with its principal: the comment it was made with (`alignatt attest --new-key`)."""
    fingerprint, comment = key_fingerprint(path)
    return SigningKey(path, comment or fingerprint, fingerprint)


def generate_key(path: Path, principal: str) -> SigningKey:
    """A new ed25519 key, no passphrase (a measuring host signs unattended), principal as comment."""
    if path.exists():
        raise AlignattError(f"{path} exists: not overwriting a key")
    path.parent.mkdir(parents=True, exist_ok=True)
    done = _run(["-q", "-t", "ed25519", "-N", "", "-C", principal, "-f", str(path)])
    if done.returncode != 0:
        raise AlignattError(f"could not make a key at {path}: {_last_line(done)}")
    return load_signing_key(path)


def allowed_signers_line(key: SigningKey) -> str:
    """The line that makes `key` trusted for run records."""
    public = Path(str(key.path) + ".pub").read_text(encoding="utf-8").split()
    return f'{key.principal} namespaces="{NAMESPACE}" {public[0]} {public[1]}\n'


def trusted_lines(files: list[Path]) -> str:
    """allowed_signers text from allowed_signers files and bare `.pub` keys (trusted under their comment)."""
    lines = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError as e:
            raise AlignattError(f"trusted keys {f}: {e.strerror}") from None
        for line in text.splitlines():
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0].startswith(("ssh-", "ecdsa-", "sk-")):  # a bare public key: "type base64 [comment]"
                principal = words[2] if len(words) > 2 else f"{f.name}"
                lines.append(f'{principal} namespaces="{NAMESPACE}" {words[0]} {words[1]}')
            else:
                lines.append(line.strip())
    return "".join(line + "\n" for line in lines)


class Verifier:
    """Checks signatures against one set of trusted keys (written once to a temporary allowed_signers)."""

    def __init__(self, trusted: str):
        self._dir = tempfile.TemporaryDirectory(prefix="alignatt-signers-")
        self.allowed = Path(self._dir.name) / "allowed_signers"
        self.allowed.write_text(trusted, encoding="utf-8")
        self.empty = not trusted.strip()

    def close(self) -> None:
        self._dir.cleanup()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def signer_of(self, data: bytes, sig: Path) -> tuple[str | None, str]:
        """(principal, "") when a trusted key made this signature over `data`; (None, why) otherwise."""
        if self.empty:
            return None, "no trusted keys (keys/allowed_signers is empty or missing)"
        found = _run(["-Y", "find-principals", "-s", str(sig), "-f", str(self.allowed)])
        if found.returncode != 0:
            return None, "signed by a key that is not trusted (not in keys/allowed_signers)"
        for principal in found.stdout.decode().split():
            done = _run(["-Y", "verify", "-f", str(self.allowed), "-I", principal, "-n", NAMESPACE,
                         "-s", str(sig)], stdin=data)
            if done.returncode == 0:
                return principal, ""
        return None, "the signature does not match the record (edited after signing)"
