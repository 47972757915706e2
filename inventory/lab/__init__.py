"""The lab: machines really apart on one box (root only; DESIGN.md "The lab", docs/architecture.md).

Each machine is a network namespace on its provider's network, a mount namespace with its own disk and
/etc, and a PID namespace whose PID 1 is its sshd; Volt reaches it only through its gate on a loopback
address, with the `ssh` driver. `manage.py lab` drives it through `inventory.lab.operations`.
"""
