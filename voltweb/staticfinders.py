"""Serve plotly.js from the installed `plotly` package as /static/plotly/plotly.min.js (never a CDN)."""

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

_BUNDLE_DIR = Path(plotly.__file__).parent / "package_data"
_FILES = {"plotly/plotly.min.js": "plotly.min.js"}


class PlotlyFinder(BaseFinder):
    storage = FileSystemStorage(location=str(_BUNDLE_DIR))

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        name = _FILES.get(path)
        if name is None:
            return [] if find_all else None
        full = str(_BUNDLE_DIR / name)
        return [full] if find_all else full

    def list(self, ignore_patterns):
        storage = FileSystemStorage(location=str(_BUNDLE_DIR))
        storage.prefix = "plotly"
        for name in _FILES.values():
            yield name, storage
