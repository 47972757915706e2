"""The embedded demo's environment, prepared before Django loads its settings (called from manage.py).

Production defaults are safe (DEBUG off, no secret in the source), so the demo turns on what it needs
for itself: DEBUG, the `local` driver (provider admins included), and a random SECRET_KEY and
VOLT_ENCRYPTION_KEY generated on first start and kept in the data dir (file mode 0600), so a restart
still decrypts what the last run stored. A variable already set in the environment wins.

No Django import: settings are not loaded yet when this runs.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import MutableMapping
from pathlib import Path

SECRETS_FILE = "demo-secrets.json"
DEMO_SWITCHES = {"DEBUG": "1", "VOLT_ALLOW_LOCAL_HOSTS": "1", "VOLT_LOCAL_HOSTS_FOR_PROVIDERS": "1"}


def prepare_demo_environment(environ: MutableMapping[str, str] | None = None) -> Path:
    """Set the demo's switches and secrets in `environ` (default: os.environ); returns the secrets file."""
    environ = os.environ if environ is None else environ
    data_dir = Path(environ.get("VOLT_DATA_DIR") or Path(__file__).resolve().parent.parent / "var")
    path = data_dir / SECRETS_FILE
    for name, value in {**DEMO_SWITCHES, **_demo_secrets(path)}.items():
        environ.setdefault(name, value)
    return path


def _demo_secrets(path: Path) -> dict[str, str]:
    """The secrets in `path`, created with fresh random values (mode 0600) if it does not exist."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "VOLT_ENCRYPTION_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)  # tighten a copy someone loosened
        stored = json.loads(path.read_text())
        return {name: str(stored[name]) for name in fresh}
    with os.fdopen(fd, "w") as handle:
        json.dump(fresh, handle)
    return fresh
