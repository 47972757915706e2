"""When the runtime's image cannot be used, a host still gets Volt's runtime, from the wheels (issue 25 item
2): a host that cannot mount it (no loop device, no squashfs in its kernel), and a control plane that cannot
build it. The host is the outer seam here: a driver that answers as a host with sudo would, whose `mount` of
the image fails. The real install is in tests/lab/test_runtime.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from inventory import host_runtime, runtime_build
from inventory.drivers.base import CommandResult, DriverError, HostDriver, HostUnreachable
from tests.inventory.test_reachability import ShellDriver

SYSTEM = {
    "privilege": "sudo",
    "pythons": [{"path": "/usr/bin/python3", "version": host_runtime.python_version()}],
}


class SudoHost(HostDriver):
    """A host with sudo: every step works except mounting the image; its runtime reports Volt's pins once
    pip has run in it."""

    address = "volt@gpu-7"

    def __init__(self):
        self.commands: list[str] = []
        self.copied: list[str] = []
        self.installed_by_pip = False

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        if command.startswith('printf "%s" "$HOME"'):
            return CommandResult(0, "/home/volt", "")
        if "@@exists" in command:  # the check of a runtime
            if not self.installed_by_pip:
                return CommandResult(0, "", "")
            report = {"python": host_runtime.python_version(), "versions": host_runtime.pins(), "foreign": []}
            return CommandResult(0, f'@@exists\n{{"by": "volt"}}\n@@report\n{json.dumps(report)}\n', "")
        if "mount -t squashfs" in command:
            return CommandResult(32, "", "mount: /opt/volt/runtime/image: failed to setup loop device.")
        if "sha256sum -- " in command and "mkdir -p" not in command:  # the check of the wheels it received
            return CommandResult(0, "".join(f"{'0' * 64}  {Path(p).name}\n" for p in self.copied), "")
        if "@@good" in command:
            return CommandResult(0, "@@good\n", "")
        if " install --quiet --no-index" in command:
            self.installed_by_pip = True
        return CommandResult(0, "", "")

    def copy_file(self, local_path: Path, remote_path: str, timeout: float | None = None) -> None:
        self.copied.append(remote_path)

    def check_reachable(self, timeout: float | None = None) -> None:
        return None


@pytest.fixture
def wheelhouse(settings, tmp_path) -> runtime_build.Wheelhouse:
    """A wheelhouse of pip's wheel alone, in a build folder of the test's own."""
    assert shutil.which("mksquashfs"), (
        "the image needs mksquashfs: apt-get install squashfs-tools (.ci/run does)"
    )
    settings.VOLT_RUNTIME_BUILD_DIR = str(tmp_path / "build")
    settings.VOLT_RUNTIME_IMAGE = True
    where = tmp_path / "wheels"
    where.mkdir()
    (where / "pip-24.0-py3-none-any.whl").write_bytes(b"not really a wheel")
    return runtime_build.Wheelhouse(where, {"pip-24.0-py3-none-any.whl": {"size": 18, "sha256": "0" * 64}})


def test_a_host_that_cannot_mount_the_image_gets_the_wheels_and_says_why(wheelhouse):
    image = tmp_image(wheelhouse)
    host, steps = SudoHost(), []

    runtime = host_runtime.install(host, SYSTEM, steps.append, wheelhouse=wheelhouse)

    assert runtime.ready and (runtime.method, runtime.wheels_copied) == ("wheels", 1)
    assert any(step.startswith("copying the runtime image") for step in steps)
    assert any("the host cannot mount the image (mount: /opt/volt/runtime/image: failed to setup loop device.)"
               in step for step in steps)  # fmt: skip
    assert host.copied == [f"/home/volt/.volt/images/{image.path.name}.part",
                           f"/home/volt/.volt/wheelhouse/{host_runtime.key()}/pip-24.0-py3-none-any.whl"]  # fmt: skip


class CopyFailsHost(SudoHost):
    """The image's copy fails midway (a full disk under the image folder) or arrives damaged."""

    def __init__(self, damaged: bool):
        super().__init__()
        self.damaged = damaged

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        if self.damaged and "@@good" in command:
            self.commands.append(command)
            return CommandResult(0, "@@bad 1234\n", "")
        return super().run(command, timeout)

    def copy_file(self, local_path: Path, remote_path: str, timeout: float | None = None) -> None:
        if remote_path.endswith(".part") and not self.damaged:
            raise DriverError(f"copying to {remote_path}: scp: write: No space left on device")
        super().copy_file(local_path, remote_path, timeout)


@pytest.mark.parametrize(
    ("damaged", "why"),
    [
        (False, "scp: write: No space left on device"),
        (True, "the runtime image arrived damaged on the host (sha256 differs): @@bad 1234"),
    ],
)
def test_an_image_copy_that_fails_or_arrives_damaged_falls_back_to_the_wheels(wheelhouse, damaged, why):
    image = tmp_image(wheelhouse)
    host, steps = CopyFailsHost(damaged), []

    runtime = host_runtime.install(host, SYSTEM, steps.append, wheelhouse=wheelhouse)

    assert runtime.ready and runtime.method == "wheels"
    said = next(step for step in steps if step.startswith("the runtime image could not be copied"))
    assert why in said and said.endswith("installing from the wheelhouse instead")
    assert (
        f"rm -f /home/volt/.volt/images/{image.path.name}.part" in host.commands
    )  # nothing half-copied left
    assert not any(command.startswith("sudo -n mount ") for command in host.commands)  # no image to mount


def test_a_host_that_stops_answering_during_the_copy_is_not_sent_the_wheels(wheelhouse):
    tmp_image(wheelhouse)

    class Gone(SudoHost):
        def copy_file(self, local_path, remote_path, timeout=None):
            raise HostUnreachable("volt@gpu-7 is not answering")

    host = Gone()
    with pytest.raises(HostUnreachable):
        host_runtime.install(host, SYSTEM, lambda step: None, wheelhouse=wheelhouse)
    assert not any("wheelhouse" in path for path in host.copied)


def test_a_control_plane_that_cannot_build_the_image_installs_from_the_wheels(wheelhouse):
    host, steps = SudoHost(), []

    # pip cannot install Volt's pins from a wheelhouse of pip alone: the image's build fails.
    runtime = host_runtime.install(host, SYSTEM, steps.append, wheelhouse=wheelhouse)

    assert runtime.ready and runtime.method == "wheels"
    failed = next(step for step in steps if step.startswith("the runtime image could not be built"))
    assert "could not build the runtime's image (python" in failed and failed.endswith(
        "installing from the wheelhouse"
    )
    assert runtime_build.load_image() is None
    assert not any(".volt/images" in path for path in host.copied)


def tmp_image(wheelhouse: runtime_build.Wheelhouse) -> runtime_build.Image:
    """An image as build_image leaves one (a small squashfs and its record), made with mksquashfs."""
    where = runtime_build.image_path()
    where.parent.mkdir(parents=True)
    content = where.parent / "content"
    content.mkdir()
    (content / "marker").write_text("an image")
    subprocess.run(["mksquashfs", str(content), str(where), "-quiet", "-no-progress"], check=True)
    record = {"size": where.stat().st_size, "sha256": runtime_build.sha256_of(where)}
    runtime_build.record_path(where).write_text(json.dumps(record))
    image = runtime_build.load_image()
    assert image is not None
    return image


def shell_host() -> ShellDriver:
    """The host's commands in a shell on this machine, in folders of the test's own."""
    return ShellDriver(SimpleNamespace(name="volt@gpu-7"))


def test_a_new_runtime_removes_the_earlier_ones_volt_installed_and_their_images(tmp_path, monkeypatch):
    """Each change of Volt's pins left the earlier runtime, its image (mounted) and its wheelhouse on every
    host for good."""
    system_dir, home = tmp_path / "opt-volt", tmp_path / "home"
    monkeypatch.setattr(host_runtime, "SYSTEM_DIR", str(system_dir))
    here = host_runtime.key()
    for folder in (f"runtime-{here}", "runtime-ray2.0.0-old", "runtime-by-provider"):
        (system_dir / folder / "bin").mkdir(parents=True)
    for folder in (f"runtime-{here}", "runtime-ray2.0.0-old"):
        (system_dir / folder / host_runtime.MARKER).write_text('{"by": "volt"}')
    (home / ".volt" / "images").mkdir(parents=True)
    for name in (f"{here}.sqfs", "ray2.0.0-old.sqfs", "ray2.0.0-old.sqfs.part"):
        (home / ".volt" / "images" / name).write_text("image")
    for name in (here, "ray2.0.0-old"):
        (home / ".volt" / "wheelhouse" / name).mkdir(parents=True)
    steps: list[str] = []

    kept = host_runtime.remove_earlier(
        shell_host(), str(home), f"{system_dir}/runtime-{here}", "", steps.append
    )

    assert kept == []
    assert sorted(p.name for p in system_dir.iterdir()) == sorted([f"runtime-{here}", "runtime-by-provider"])
    assert [p.name for p in (home / ".volt" / "images").iterdir()] == [f"{here}.sqfs"]
    assert [p.name for p in (home / ".volt" / "wheelhouse").iterdir()] == [here]
    assert steps == [f"removed earlier runtimes: {system_dir}/runtime-ray2.0.0-old"]


def test_an_earlier_runtimes_mounted_image_is_unmounted_before_its_folder_goes(tmp_path, monkeypatch):
    """Root, as a host where Volt logs in as root (CI runs as root): a real squashfs, really mounted."""
    system_dir = tmp_path / "opt-volt"
    monkeypatch.setattr(host_runtime, "SYSTEM_DIR", str(system_dir))
    old = system_dir / "runtime-ray2.0.0-old"
    (old / host_runtime.IMAGE_MOUNT).mkdir(parents=True)
    (old / host_runtime.MARKER).write_text('{"by": "volt", "how": "image"}')
    content = tmp_path / "content"
    content.mkdir()
    (content / "marker").write_text("an old image")
    image = tmp_path / "old.sqfs"
    subprocess.run(["mksquashfs", str(content), str(image), "-quiet", "-noappend"], check=True)
    subprocess.run(["mount", *host_runtime.MOUNT_OPTIONS.split(), str(image), str(old / "image")], check=True)
    try:
        steps: list[str] = []
        kept = host_runtime.remove_earlier(shell_host(), str(tmp_path / "home"), str(system_dir / "runtime-new"),
                                           "", steps.append)  # fmt: skip
        assert kept == [] and not old.exists()
        assert steps == [f"removed earlier runtimes: {old}"]
    finally:
        if subprocess.run(["mountpoint", "-q", str(old / "image")]).returncode == 0:
            subprocess.run(["umount", str(old / "image")])
