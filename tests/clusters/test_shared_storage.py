"""Where local clusters' shared storage lives: somewhere a cluster's own Unix user can reach.

With Ray running as a cluster user, a data dir under a folder closed to others (pytest's tmp folders,
/root, a `mktemp -d` checkout) made every checkpoint write fail with EACCES. Fails before the fix (storage
was always under the data dir), passes after.
"""

from pathlib import Path

from clusters import tenancy
from voltweb import namespace


def test_storage_stays_in_an_open_data_dir(settings, tmp_path):
    opened = tmp_path / "open"
    opened.mkdir()
    closed = [f for f in (opened, *opened.parents) if not f.stat().st_mode & 0o001]
    modes = {folder: folder.stat().st_mode for folder in closed}
    try:
        for folder in closed:  # tmp_path and pytest's folders above it: opened for this test only
            folder.chmod(modes[folder] | 0o001)
        settings.VOLT_DATA_DIR = str(opened / "data")
        assert tenancy.shared_storage_root() == opened / "data" / "shared-storage"
    finally:
        for folder in closed:
            folder.chmod(modes[folder])


def test_storage_moves_out_of_a_data_dir_others_cannot_reach(settings, tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    settings.VOLT_DATA_DIR = str(closed / "data")
    root = tenancy.shared_storage_root()
    assert (
        root == Path("/var/tmp") / f"volt-{namespace.install_id(settings.VOLT_DATA_DIR)}" / "shared-storage"
    )
    assert not str(root).startswith(str(closed))
