"""The API's router: DRF's DefaultRouter without format-suffix routes (`/clusters/1.json/`).

The API speaks JSON only; the suffixed copies of every route were undocumented, and custom actions
(revoke, terminate, ...) answered them with a 500 (an unexpected `format` argument).
"""

from rest_framework.routers import DefaultRouter


class VoltRouter(DefaultRouter):
    include_format_suffixes = False
