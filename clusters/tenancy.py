"""What a cluster owns on its hosts and what proves it is the team's: DESIGN.md "Security".

- an ed25519 key pair (SSH hosts authorize the public half; the team downloads the private half),
- a Ray token: every node runs `RAY_AUTH_MODE=token`, Volt's workers send it to the head, the team
  gets it in the READY hand-off,
- where Volt has the privilege (`local` hosts when Volt is root; SSH hosts whose login user is root or may
  use passwordless sudo), a Unix user of its own that its Ray processes run as, removed with everything
  it still runs when the cluster ends,
- its nodes' temp dirs and its shared storage.

Secrets are Fernet-encrypted at rest (voltweb/crypto.py) and generated once per cluster.
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from urllib.parse import urlparse

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.utils import timezone

from clusters.models import Cluster, ClusterNode
from clusters.provisioning import node_firewall, node_users, ray_nodes
from inventory import local_runtime
from inventory import services as inventory
from inventory.choices import DriverKind
from inventory.drivers.base import DriverError, HostDriver, fan_out
from inventory.drivers.sudo import SudoDriver
from voltweb import crypto, namespace

NOT_FIREWALLED = (
    "Volt cannot close its own service ports (database, Redis, web) to the cluster's user here (`nft` is "
    "missing: install nftables): its jobs can open connections to them"
)
NOT_ISOLATED = (
    "Ray runs as Volt's own Unix user on the local hosts (Volt is not root here, or there is no local Ray "
    "runtime other users can run: `manage.py local_runtime` builds it), so it cannot run Ray as a user of "
    "the cluster's own: its jobs are not isolated from Volt's processes"
)


def environment_open_to_others(python: str | None = None) -> bool:
    """Whether another Unix user can run the Python local hosts run Ray from (default: the local runtime
    when it is there, else Volt's own): every folder above it, and above the interpreter a venv's python
    links to, searchable by others. Volt's own venv usually is not (it links into /root/.pyenv, or sits
    in a `mktemp -d` checkout): then a cluster user's `ray start` would fail with EACCES."""
    return local_runtime.open_to_others(python or local_runtime.python_for_local_hosts())


def ray_cluster_id(cluster: Cluster) -> str:
    """The name of the cluster on its hosts (workdirs, the node marker): the install's id keeps two Volts
    on one machine apart."""
    return f"volt-{namespace.current_id()}-{cluster.pk}"


def ensure_keys(cluster: Cluster) -> None:
    """The cluster's own ed25519 key pair and Ray token, encrypted at rest. Each generated once."""
    if not cluster.ray_auth_token_encrypted:
        Cluster.objects.filter(pk=cluster.pk, ray_auth_token_encrypted="").update(
            ray_auth_token_encrypted=crypto.encrypt(
                secrets.token_hex(32)
            )  # 256 bits, as `ray get-auth-token`
        )
        cluster.refresh_from_db(fields=["ray_auth_token_encrypted"])
    if cluster.ssh_public_key:
        return
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    public_line = f"{public.decode()} volt-cluster-{cluster.pk}"
    Cluster.objects.filter(pk=cluster.pk, ssh_public_key="").update(
        ssh_public_key=public_line, ssh_private_key_encrypted=crypto.encrypt(private)
    )
    cluster.refresh_from_db(fields=["ssh_public_key", "ssh_private_key_encrypted"])


# How a cluster's public key is authorized on its hosts: the team may forward ports through the host's SSH
# user to its head's dashboard alone (the hand-off's `ssh_command`; `permitopen`), never run a command as that
# user nor reach anything else the host reaches (another cluster's dashboard, the provider's network). It is
# Volt's own login (on a provider's host often with sudo).
AUTHORIZED_KEY_OPTIONS = 'restrict,port-forwarding,command="/bin/false"'


def authorized_key_line(cluster: Cluster, dashboard: str | None = None) -> str:
    """The cluster's line in its hosts' ~/.ssh/authorized_keys: AUTHORIZED_KEY_OPTIONS, with `dashboard`
    (`<head ip>:<port>`, dashboard_target) the one place a forward may go, then the key."""
    permit = f',permitopen="{dashboard}"' if dashboard else ""
    return f"{AUTHORIZED_KEY_OPTIONS}{permit} {cluster.ssh_public_key}"


def authorized_keys_script(public_key: str, line: str | None = None) -> str:
    """Shell: the login's ~/.ssh/authorized_keys without any line holding `public_key`, then with `line` (if
    given and not there already). Under a lock (two clusters' bring-ups and teardowns on one host at once
    must not read a file the other is rewriting: Volt's own login key would go), through a private temp file,
    and the file rewritten only when that filtering worked: a failing grep never empties it."""
    keys, public = "~/.ssh/authorized_keys", shlex.quote(public_key)
    steps = [
        "flock -w 30 9 || { echo 'authorized_keys is locked by another of Volt' >&2; exit 6; }",
        *([f"grep -qxF {shlex.quote(line)} {keys} && exit 0"] if line else []),
        "t=$(mktemp ~/.ssh/.ak.volt.XXXXXX) || exit 6",
        f'grep -vF {public} {keys} > "$t"; s=$?',
        'if [ "$s" -gt 1 ]; then rm -f "$t"; exit 6; fi',
        *([f'echo {shlex.quote(line)} >> "$t" || {{ rm -f "$t"; exit 6; }}'] if line else []),
        f'cat "$t" > {keys}; s=$?; rm -f "$t"; exit $s',
    ]
    body = "; ".join(steps)
    return f"mkdir -p ~/.ssh && chmod 700 ~/.ssh && touch {keys} && ( {body} ) 9> ~/.ssh/.volt-keys.lock"


def dashboard_target(nodes: list[ClusterNode]) -> str | None:
    """`<head's node ip>:<its dashboard port>` of a cluster whose nodes have their slots, as permitopen takes it
    (an IPv6 address in brackets); None without a head."""
    head = next((n for n in nodes if n.is_head and n.slot is not None), None)
    if head is None:
        return None
    ip = head.node_ip
    return f"{f'[{ip}]' if ':' in ip else ip}:{ray_nodes.ports_for(head.slot).dashboard}"


def ray_auth_token(cluster: Cluster) -> str:
    """The cluster's Ray token in clear ("" before provisioning): Volt's own calls and the team's hand-off."""
    return crypto.decrypt(cluster.ray_auth_token_encrypted)


def ensure_node_user(cluster: Cluster, nodes: list[ClusterNode], drivers: list[HostDriver]) -> str | None:
    """The Unix user the cluster's Ray runs as on its local hosts (created if missing), or None.

    None when it has no local host, when the Python it runs Ray from is closed to other users (no local
    runtime, inventory/local_runtime.py), or when Volt is not root
    (then Ray runs as Volt's own user: the
    caller says so on the timeline, see NOT_ISOLATED). Local hosts share this machine, so one user
    serves every local node of the cluster. SSH hosts get theirs from ensure_ssh_node_users.
    Raises DriverError if the user cannot be made.
    """
    local = [d for n, d in zip(nodes, drivers, strict=True) if n.host.driver == DriverKind.LOCAL]
    if not local or not environment_open_to_others():
        return None
    name = _node_user_name(cluster)
    for number, driver in enumerate(local):  # one machine: any host that answers will do
        try:
            if not node_users.ensure_user(driver, name):
                return None
            break
        except DriverError:
            if number == len(local) - 1:
                raise
    _record_node_user(cluster, name)
    return name


def ensure_ssh_node_users(
    cluster: Cluster, nodes: list[ClusterNode], drivers: list[HostDriver]
) -> list[tuple[ClusterNode, Exception]]:
    """The cluster's own Unix user on each of its SSH hosts where Volt has the privilege (own_user_host),
    created if missing with the same uid and gid everywhere (VOLT_SSH_NODE_UID_BASE + the cluster's id: the
    hosts share the storage folder); `drivers` are node_driver's. The nodes it failed on, with why.

    For clusters with no local host: one with both (which a real network would not join) keeps Ray as the
    SSH login on its SSH hosts, so that its one `node_user` names this machine's user alone."""
    pairs = [(n, d) for n, d in zip(nodes, drivers, strict=True) if own_user_host(n.host)]
    if not pairs:
        return []
    name = _node_user_name(cluster)
    uid = ssh_node_uid(cluster)

    def ensure(driver: HostDriver) -> None:
        if not node_users.ensure_user(driver, name, uid=uid):
            raise node_users.UserSetupFailed(
                f"{driver.address} did not run Volt's command as root: the cluster cannot run as a user of "
                "its own there. Rediscover the host (its recorded privilege is out of date)."
            )

    results = fan_out([d for _, d in pairs], ensure)
    failed = [(n, r) for (n, _), r in zip(pairs, results, strict=True) if isinstance(r, Exception)]
    if len(failed) < len(pairs):
        _record_node_user(cluster, name)
    return failed


def _node_user_name(cluster: Cluster) -> str:
    return cluster.node_user or node_users.user_name(cluster.pk, namespace.install_seed())


def _record_node_user(cluster: Cluster, name: str) -> None:
    if cluster.node_user != name:
        Cluster.objects.filter(pk=cluster.pk).update(node_user=name)
        cluster.node_user = name


def ssh_node_uid(cluster: Cluster) -> int:
    """The uid (and gid) of the cluster's user on every SSH host (see ensure_ssh_node_users)."""
    return int(settings.VOLT_SSH_NODE_UID_BASE) + int(cluster.pk)


def own_user_host(host) -> bool:
    """Whether the cluster's Ray runs as a Unix user of its own on this SSH host: Volt's login user there is
    root or may use passwordless sudo (discovery records which: `Host.system["privilege"]`)."""
    return host.driver == DriverKind.SSH and (host.system or {}).get("privilege") in ("root", "sudo")


def node_user_on(cluster: Cluster, host) -> str | None:
    """The Unix user the cluster's Ray runs as on `host`, when it is one of the cluster's own; else None
    (Ray runs as the driver's user: Volt's own, or the SSH login)."""
    if not cluster.node_user:
        return None
    if host.driver == DriverKind.LOCAL:
        return cluster.node_user
    if own_user_host(host) and not cluster.nodes.filter(host__driver=DriverKind.LOCAL).exists():
        return cluster.node_user  # a cluster with local hosts too keeps its SSH hosts' login (see above)
    return None


def node_driver(host) -> HostDriver:
    """The driver cluster work on `host` goes through: on an SSH host where Volt may use sudo, every command
    as root (`sudo -n`), which starting Ray as the cluster's user, finding its processes and reading as it
    need; elsewhere the host's own driver."""
    driver = inventory.driver_for(host)
    if host.driver == DriverKind.SSH and (host.system or {}).get("privilege") == "sudo":
        return SudoDriver(driver)
    return driver


def remove_ssh_node_user(cluster: Cluster, driver: HostDriver, nodes: list[ClusterNode]) -> None:
    """Remove the cluster's user from one SSH host (`nodes`: the cluster's nodes there), with whatever still
    runs as it and its nodes' temp dirs; its shared storage goes back to root. Raises DriverError."""
    shared = [f"{settings.VOLT_SSH_SHARED_DIR.rstrip('/')}/{ray_cluster_id(cluster)}"]
    node_users.remove_user(
        driver,
        cluster.node_user,
        remove_dirs=[node_temp_dir(cluster, n) for n in nodes if n.slot is not None],
        disown_dirs=shared if settings.VOLT_SSH_SHARED_DIR else [],
    )


def volt_service_ports() -> set[int]:
    """TCP ports of Volt's own services on this machine, closed to cluster users (node_firewall): the
    database's and Redis's (from their URLs), VOLT_SERVICE_PORTS (the web server's; the demo adds its) and
    VOLT_STORE_PRIVATE_PORTS (an embedded store's keyless ports; its S3 API stays open: jobs use it)."""
    ports = {int(p) for p in [*settings.VOLT_SERVICE_PORTS, *settings.VOLT_STORE_PRIVATE_PORTS]}
    database = settings.DATABASES["default"]
    if "postgresql" in database["ENGINE"]:
        ports.add(int(database.get("PORT") or 5432))
    for url in {settings.REDIS_URL, settings.CELERY_BROKER_URL}:
        parsed = urlparse(url)
        if parsed.scheme in ("redis", "rediss"):
            ports.add(parsed.port or 6379)
    return ports


def volt_socket_dirs() -> list[str]:
    """Folders of Volt's services' Unix sockets, hidden from cluster nodes (node_firewall.hide_prefix):
    PostgreSQL's (libpq's default folder, or DATABASE_URL's when it names one) and a unix:// Redis's."""
    folders = []
    database = settings.DATABASES["default"]
    if "postgresql" in database["ENGINE"]:
        host = str(database.get("HOST") or "")
        folders += [host] if host.startswith("/") else ["/run/postgresql", "/var/run/postgresql"]
    for url in {settings.REDIS_URL, settings.CELERY_BROKER_URL}:
        parsed = urlparse(url)
        if parsed.scheme == "unix" and parsed.path:
            folders.append(str(Path(parsed.path).parent))
    return folders


def close_volt_ports(cluster: Cluster) -> bool:
    """Refuse the cluster's user every connection to Volt's service ports on this machine; True when the
    rule is in place, False when it cannot be (no `nft`; the caller says so on the timeline: NOT_FIREWALLED).
    Local hosts share this machine: one rule, written on the machine itself (not through a host's driver: a
    host faulted `unreachable` must fail as that host, later, with its name). Raises DriverError."""
    if not cluster.node_user:
        return False
    with inventory.local_machine_driver() as driver:
        uid = node_users.uid_of(driver, cluster.node_user)
        if uid is None:
            raise node_users.UserSetupFailed(
                f"the cluster's user {cluster.node_user} is missing on this machine"
            )
        return node_firewall.admit(driver, namespace.current_id(), uid, volt_service_ports())


def remove_node_user(cluster: Cluster) -> list[str]:
    """Remove the cluster's Unix user, its processes and temp dirs; disown its storage. Problems, or [].

    Done on this machine, not through a host's driver: local hosts are folders of this machine, so the
    user is the machine's, and a host faulted `unreachable` (a drill) or gone must not keep it alive. What
    could not be removed stays pending (`node_user_removed_at` empty) and the reaper tries again
    (clusters.services.reap_cluster_leftovers).
    """
    if not cluster.node_user or cluster.node_user_removed_at is not None:
        return []
    slots = [n for n in cluster.nodes.all() if n.slot is not None]
    try:
        with inventory.local_machine_driver() as driver:
            uid = node_users.uid_of(driver, cluster.node_user)
            node_users.remove_user(
                driver,
                cluster.node_user,
                remove_dirs=[node_temp_dir(cluster, n) for n in slots],
                disown_dirs=[str(shared_storage_dir(cluster))],
            )
            if uid is not None:  # after its processes are gone: none may slip through in between
                node_firewall.release(driver, namespace.current_id(), uid)
    except DriverError as exc:
        return [f"user {cluster.node_user}: {exc}"]
    cluster.node_user_removed_at = timezone.now()
    Cluster.objects.filter(pk=cluster.pk).update(node_user_removed_at=cluster.node_user_removed_at)
    return []


def as_node_user(cluster: Cluster, host, command: str) -> str:
    """`command` as the user the cluster's Ray runs as on `host`, for anything Volt reads or walks on a path
    the cluster's jobs can write (their logs, their checkpoints).

    A job is hostile code: as root, Volt would follow a link the job left in place of its log to any file
    of the machine (Volt's secrets, /etc/shadow) and hand it back as the job's log. Run as the cluster's
    user, the read gets exactly what the job itself could read. Hosts with a user of the cluster's own
    switch to it (local hosts: Volt is root; SSH hosts: through node_driver's root); elsewhere Ray runs as
    the driver's own user already."""
    switch = node_user_prefix(cluster, host)
    return f"{switch}sh -c {shlex.quote(command)}" if switch else command


def node_user_prefix(cluster: Cluster, host) -> str:
    """`setpriv ... -- ` that runs what follows as the cluster's own user on `host`, or "" (see as_node_user)."""
    name = node_user_on(cluster, host)
    if name:
        user = shlex.quote(name)
        return f"setpriv --reuid={user} --regid={user} --clear-groups -- "
    return ""


def node_temp_dir(cluster: Cluster, node: ClusterNode) -> str:
    """Ray's temp dir of one node (short: its socket paths must fit in 107 bytes)."""
    return f"{namespace.ray_temp_root()}/{cluster.pk}-{node.slot}"


def storage_location(cluster: Cluster, *parts: str | int) -> str:
    """The cluster's shared storage, or a place in it, as a user on its head node reaches it:
    `~/volt/clusters/<ray id>/storage[/parts…]`, in the host user's home on every node. The one way the
    console names it (the connect box, a job's checkpoint rows); on local hosts that path is a link to
    shared_storage_dir, which is this machine's folder and no user's to type."""
    return "/".join([f"~/{ray_nodes.workdir_for(ray_cluster_id(cluster))}/storage", *map(str, parts)])


def shared_storage_dir(cluster: Cluster) -> Path:
    """Local hosts share this machine: their storage paths all point at one folder (a real shared FS)."""
    return shared_storage_root() / ray_cluster_id(cluster)


def shared_storage_root() -> Path:
    """Where local clusters' shared storage lives: `<VOLT_DATA_DIR>/shared-storage` when other users can
    reach it, else `/var/tmp/volt-<install id>/shared-storage`.

    A cluster's Unix user writes its jobs' checkpoints there; a data dir under a folder closed to others
    (/root, a `mktemp -d` checkout, pytest's tmp folders) made every checkpoint write fail with EACCES. The
    choice depends only on the data dir, so it is the same for a cluster's whole life. Each cluster's own
    folder is its user's, mode 0700 (provision.prepare_host): clusters do not read each other's."""
    inside = Path(settings.VOLT_DATA_DIR).absolute() / "shared-storage"
    if _searchable_by_others(inside.parent):
        return inside
    return Path("/var/tmp") / f"volt-{namespace.current_id()}" / "shared-storage"


def _searchable_by_others(folder: Path) -> bool:
    try:
        return all(f.stat().st_mode & 0o001 for f in (folder, *folder.parents) if f.exists())
    except OSError:
        return False
