"""Settings for the test suite (pytest's DJANGO_SETTINGS_MODULE): the real settings, with what tests need.

Written into the environment before the real settings load, so the processes tests start (Celery
workers, daphne, `manage.py`) inherit the same values. An explicit environment variable still wins.
- DEBUG=1: the dev secret key is accepted and no HTTPS redirect applies (pytest-django still runs each
  test with DEBUG off).
- VOLT_ALLOW_LOCAL_HOSTS=1: the `local` driver, off by default in production, simulates provider hosts.
- VOLT_LOCALITY_WAIT_S=0: requests are placed as written unless they ask to wait for locality (the default
  wait is tested where it is the subject: tests/clusters/test_locality.py).
"""

import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("VOLT_ALLOW_LOCAL_HOSTS", "1")
os.environ.setdefault("VOLT_LOCALITY_WAIT_S", "0")

from voltweb.settings import *  # noqa: E402, F403
