#!/usr/bin/env python
"""Django's command-line utility for Volt."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "voltweb.settings")
    if sys.argv[1:2] == ["demo"]:
        # Before settings load: the demo turns on DEBUG and keeps its own generated secrets.
        from voltweb.demo_env import prepare_demo_environment

        prepare_demo_environment()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
