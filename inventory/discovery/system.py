"""What a host runs besides its GPUs: OS, kernel, the Pythons on its PATH, the NVIDIA driver and CUDA
version, and what Volt may do there (root, passwordless sudo, or neither). Pure Python: one shell
command (SYSTEM_COMMAND, one round trip) and its parser.

Onboarding records these on the host (`Host.system`) so the host runtime can be brought over SSH and
checked against Volt's pins (issue 25: the runtime a cluster's head, workers and submitter share).
Nothing here fails onboarding: a fact the host does not print is left empty.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# Each section starts with a line "@@<name>"; commands that are missing print nothing.
SYSTEM_COMMAND = "; ".join(
    [
        "echo @@os",
        "cat /etc/os-release 2>/dev/null",
        "echo @@kernel",
        "uname -srm 2>/dev/null",
        "echo @@pythons",
        "for p in python3 python3.13 python3.12 python3.11 python3.10 python3.9; do"
        ' w=$(command -v "$p" 2>/dev/null) && echo "$w $("$w" -c'
        ' \'import sys; print("%d.%d.%d" % sys.version_info[:3])\' 2>/dev/null)"; done',
        "echo @@smi",
        "nvidia-smi 2>/dev/null | grep -m1 'Driver Version'",
        "echo @@user",
        "id -un 2>/dev/null; id -u 2>/dev/null",
        "echo @@addresses",
        "if command -v ip >/dev/null 2>&1; then ip -o -4 addr show 2>/dev/null | awk '{print $4}';"
        " else hostname -I 2>/dev/null | tr ' ' '\\n'; fi",
        "echo @@sudo",
        "if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then echo yes; else echo no; fi",
        # What a cluster's WireGuard overlay needs (clusters/provisioning/overlay.py): `wg`, and kernel
        # WireGuard or wireguard-go over /dev/net/tun.
        "echo @@wireguard",
        "command -v wg >/dev/null 2>&1 && echo wg",
        "command -v wireguard-go >/dev/null 2>&1 && echo wireguard-go",
        "{ [ -d /sys/module/wireguard ] || modprobe -n -q wireguard 2>/dev/null; } && echo kernel",
        "[ -c /dev/net/tun ] && echo tun",
        "true",
    ]
)

_DRIVER = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")
_CUDA = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)")
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")


@dataclass(frozen=True)
class HostSystem:
    os: str = ""  # PRETTY_NAME of /etc/os-release, e.g. "Ubuntu 22.04.4 LTS"
    os_id: str = ""  # ID and VERSION_ID, e.g. "ubuntu 22.04"
    kernel: str = ""  # uname -r
    arch: str = ""  # uname -m
    pythons: tuple[tuple[str, str], ...] = ()  # (path, version), each interpreter once
    driver_version: str = ""
    cuda_version: str = ""
    user: str = ""
    privilege: str = ""  # "root", "sudo" (passwordless) or "none"; "" when unknown
    addresses: tuple[str, ...] = ()  # the host's own IPv4 addresses (`ip -4 addr`), loopback included
    wireguard: tuple[str, ...] | None = None  # of "wg", "wireguard-go", "kernel", "tun"; None: not asked

    @property
    def overlay(self) -> str:
        """How a cluster's overlay would run here: "kernel", "wireguard-go", "" (it cannot: `overlay_missing`
        says what to install), or "unknown" (discovered before Volt asked)."""
        if self.wireguard is None:
            return "unknown"
        if "wg" not in self.wireguard:
            return ""
        if "kernel" in self.wireguard:
            return "kernel"
        return "wireguard-go" if {"wireguard-go", "tun"} <= set(self.wireguard) else ""

    @property
    def overlay_missing(self) -> str:
        """What the host lacks for an overlay, in words a provider acts on ("" when nothing)."""
        if self.overlay:
            return ""
        have = set(self.wireguard or ())
        missing = [] if "wg" in have else ["`wg` (install wireguard-tools)"]
        if "kernel" not in have:
            if "wireguard-go" not in have:
                missing.append("kernel WireGuard or wireguard-go (install wireguard-go)")
            if "tun" not in have:
                missing.append("/dev/net/tun (wireguard-go needs it)")
        return ", ".join(missing)

    def as_json(self) -> dict:
        data = asdict(self)
        data["pythons"] = [{"path": path, "version": version} for path, version in self.pythons]
        data["addresses"] = list(self.addresses)
        data["wireguard"] = None if self.wireguard is None else list(self.wireguard)
        data["overlay"], data["overlay_missing"] = self.overlay, self.overlay_missing
        return data

    @property
    def summary(self) -> str:
        """One line for the host's history: "Debian GNU/Linux 12 (bookworm), kernel 6.1.0, Python 3.11.2,
        driver 550.54.15 (CUDA 12.4), Volt may use sudo"."""
        parts = [self.os or "unknown OS"]
        if self.kernel:
            parts.append(f"kernel {self.kernel}")
        versions = sorted({version for _, version in self.pythons})
        parts.append(f"Python {', '.join(versions)}" if versions else "no Python 3")
        if self.driver_version:
            cuda = f" (CUDA {self.cuda_version})" if self.cuda_version else ""
            parts.append(f"driver {self.driver_version}{cuda}")
        parts.append(
            {
                "root": "Volt logs in as root",
                "sudo": "Volt may use sudo",
                "none": "no sudo for Volt's user",
            }.get(self.privilege, "sudo unknown")
        )
        return ", ".join(parts)

    @property
    def overlay_summary(self) -> str:
        """The history's words on overlays (SSH hosts): "overlay by wireguard-go", "no overlay possible: needs
        …", or "" when not asked."""
        if self.overlay in ("kernel", "wireguard-go"):
            return f"overlay by {'kernel WireGuard' if self.overlay == 'kernel' else 'wireguard-go'}"
        if self.overlay == "":
            return f"no overlay possible: needs {self.overlay_missing}"
        return ""


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("@@"):
            current = line[2:]
            sections.setdefault(current, [])
        elif current is not None and line:
            sections[current].append(line)
    return sections


def _os_release(lines: list[str]) -> dict[str, str]:
    values = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            values[key] = value.strip().strip('"').strip("'")
    return values


def parse_system(text: str) -> HostSystem:
    """The facts SYSTEM_COMMAND printed. Unknown lines are ignored; a missing section leaves its fact empty."""
    sections = _sections(text)
    release = _os_release(sections.get("os", []))
    os_id = " ".join(v for v in (release.get("ID", ""), release.get("VERSION_ID", "")) if v)
    kernel = arch = ""
    uname = (sections.get("kernel") or [""])[0].split()
    if len(uname) >= 3:
        kernel, arch = uname[1], uname[2]
    elif len(uname) == 2:
        kernel = uname[1]
    pythons, seen = [], set()
    for line in sections.get("pythons", []):
        path, _, version = line.partition(" ")
        if path.startswith("/") and _VERSION.match(version) and path not in seen:
            seen.add(path)
            pythons.append((path, version))
    smi = " ".join(sections.get("smi", []))
    driver, cuda = _DRIVER.search(smi), _CUDA.search(smi)
    user_lines = sections.get("user", [])
    user = user_lines[0] if user_lines else ""
    uid = user_lines[1] if len(user_lines) > 1 else ""
    addresses = []
    for line in sections.get("addresses", []):
        address = line.partition("/")[0]
        if _IPV4.match(address) and address not in addresses:
            addresses.append(address)
    sudo = (sections.get("sudo") or [""])[0]
    privilege = "root" if uid == "0" else {"yes": "sudo", "no": "none"}.get(sudo, "")
    return HostSystem(
        os=release.get("PRETTY_NAME", "") or release.get("NAME", ""),
        os_id=os_id,
        kernel=kernel,
        arch=arch,
        pythons=tuple(pythons),
        driver_version=driver.group(1) if driver else "",
        cuda_version=cuda.group(1) if cuda else "",
        user=user,
        privilege=privilege,
        addresses=tuple(addresses),
        wireguard=_wireguard(sections),
    )


def _wireguard(sections: dict[str, list[str]]) -> tuple[str, ...] | None:
    if "wireguard" not in sections:
        return None
    known = ("wg", "wireguard-go", "kernel", "tun")
    return tuple(word for word in known if word in sections["wireguard"])
