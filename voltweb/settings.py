"""Volt settings. Every value comes from the environment; the defaults are the safe production ones.

Production sets at least SECRET_KEY, ALLOWED_HOSTS, DATABASE_URL (PostgreSQL) and REDIS_URL; DEBUG is
off unless set. The embedded demo (`manage.py demo`, voltweb/demo_env.py) turns DEBUG on for itself and
keeps generated secrets in its data dir; the test suite uses voltweb/settings_test.py.
See README.md "Configuration" for the full list.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from voltweb import datadir, namespace
from voltweb.env import env_bool, env_float, env_int, env_list, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", False)
_DEV_SECRET = "volt-insecure-dev-key-change-me-in-production-0123456789abcdef"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
if not DEBUG and SECRET_KEY == _DEV_SECRET:
    raise ImproperlyConfigured("SECRET_KEY must be set (50+ random characters) when DEBUG=0.")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must name this server's host names when DEBUG=0.")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Where the embedded demo keeps its SQLite file and the `local` driver its host sandboxes.
VOLT_DATA_DIR = Path(env_str("VOLT_DATA_DIR", str(BASE_DIR / "var")))
# What names this install on hosts and in Redis (Ray cluster ids, Unix users, process markers, the channel
# prefix); derived from VOLT_DATA_DIR when unset. Processes of one install on several machines (workers
# elsewhere, docs/deployment.md) each have a data dir of their own: give them all the same id.
VOLT_INSTALL_ID = env_str("VOLT_INSTALL_ID", "")
if VOLT_INSTALL_ID and not re.fullmatch(r"[a-z0-9]{1,12}", VOLT_INSTALL_ID):
    raise ImproperlyConfigured(
        f"VOLT_INSTALL_ID must be 1-12 lower-case letters or digits (it names Ray clusters), not {VOLT_INSTALL_ID!r}"
    )

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "channels",
    "voltweb",
    "inventory",
    "clusters",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "voltweb.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "voltweb.middleware.InputGuardMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "voltweb.errors.ErrorPagesMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "voltweb.urls"
WSGI_APPLICATION = "voltweb.wsgi.application"
ASGI_APPLICATION = "voltweb.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "voltweb.context_processors.volt",
            ],
        },
    },
]

_default_db = f"sqlite:///{VOLT_DATA_DIR / 'volt.sqlite3'}"
_database_url = env_url("DATABASE_URL", _default_db, {"sqlite", "postgres", "postgresql", "pgsql"})
try:
    DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=env_int("DB_CONN_MAX_AGE", 0))}
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is invalid: {exc}") from None
_sqlite = DATABASES["default"]["ENGINE"].endswith("sqlite3") and DATABASES["default"]["NAME"] != ":memory:"
datadir.make_private(VOLT_DATA_DIR, Path(DATABASES["default"]["NAME"]) if _sqlite else None)
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # The demo's web server, Celery workers and beat write to one file at once. A transaction that reads
    # then writes (recording a discovery, polling a job) began as a reader in SQLite's default DEFERRED
    # mode, and its upgrade to a writer failed at once with "database is locked" when another process had
    # written meanwhile: the busy timeout never applies there. IMMEDIATE takes the write lock at BEGIN,
    # where the timeout does apply (writers queue, 20 s at most); WAL lets readers run beside the writer.
    # SQLite creates the -wal and -shm files with the database file's own mode (0600 stays 0600).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL"}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "inventory:offers"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve static files straight from the finders (app dirs, STATICFILES_DIRS, plotly's bundle) without
# collectstatic in the demo and in tests.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "voltweb.staticfinders.PlotlyFinder",
]

# Security settings that `manage.py check --deploy` asks for; all on unless DEBUG.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_TLS_PROXY", False) else None
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Largest request body (bytes): Django's form parsing and the API's JSON parser both refuse more (400).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 256 * 1024, minimum=1024)
SILENCED_SYSTEM_CHECKS = env_list("SILENCED_SYSTEM_CHECKS", [])

# Fernet key for secrets at rest (SSH private keys). Derived from SECRET_KEY unless set explicitly.
_fernet = env_str("VOLT_ENCRYPTION_KEY", "")
if _fernet:
    try:
        if len(base64.urlsafe_b64decode(_fernet)) != 32:
            raise ValueError
    except ValueError:
        raise ImproperlyConfigured(
            "VOLT_ENCRYPTION_KEY must be a Fernet key (32 url-safe base64 bytes); "
            "make one with: python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
        ) from None
    VOLT_ENCRYPTION_KEY = _fernet
else:
    VOLT_ENCRYPTION_KEY = base64.urlsafe_b64encode(hashlib.sha256(SECRET_KEY.encode()).digest()).decode()

# --- Redis, Celery, Channels -------------------------------------------------------------------
# Unset, each install (data dir) gets its own DB index, 1-15, so two checkouts never share queues.
REDIS_URL = env_url("REDIS_URL", namespace.default_redis_url(VOLT_DATA_DIR), {"redis", "rediss", "unix"})

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
# Reliability (DESIGN.md "Facts learned the hard way"): a task is acknowledged only once done, comes
# back if its worker dies, and no worker hoards tasks. The visibility timeout must exceed the longest
# task's hard limit or Redis redelivers a task that is still running.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 300, minimum=1)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 360, minimum=2)
if CELERY_TASK_TIME_LIMIT <= CELERY_TASK_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured("CELERY_TASK_TIME_LIMIT must be larger than CELERY_TASK_SOFT_TIME_LIMIT.")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Longer than the longest task (a host runtime install: 1960 s hard limit; provisioning: 1560 s).
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600, minimum=2000),
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "monitoring"
VOLT_QUEUES = ("placement", "provisioning", "monitoring", "jobs")
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "volt",
        "TIMEOUT": 300,
    }
}

# Redis pub/sub: a group_send is one PUBLISH, and each web process receives it once and hands it to its
# local sockets. (The list-based RedisChannelLayer stores one copy per subscriber and the web process pops
# them one round trip at a time: 1,000 subscribers of one cluster cost 1,000 pops per event.) Nothing is
# queued for a socket that is gone: pages restore from the snapshot on reconnect (DESIGN.md).
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": namespace.channel_prefix(VOLT_INSTALL_ID or REDIS_URL)},
    }
}

# --- API ---------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "voltweb.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "voltweb.api.pagination.VoltPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "voltweb.api.errors.exception_handler",
    # JSON (and plain forms for the browsable API). Multipart only where a file is taken (the job
    # submission view adds it); Twisted no longer parses it first (voltweb/asgi.py).
    "DEFAULT_PARSER_CLASSES": [
        "voltweb.api.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
    ],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Volt API",
    "DESCRIPTION": "Multi-provider GPU inventory, topology-aware clusters, jobs. "
    "Authenticate with `Authorization: Bearer <token>` (create tokens in the console under API tokens).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "FabricKindEnum": "inventory.choices.FabricKind",
        "HostEventKindEnum": "inventory.choices.HostEventKind",
        "ConstraintModeEnum": "clusters.choices.ConstraintMode",
        "TopologyLevelEnum": "clusters.choices.TopologyLevel",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "voltweb.api.schema.add_error_responses",
    ],
    "SWAGGER_UI_DIST": "SIDECAR",  # served by the app: no CDN
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No request may leave the server: Swagger UI's validator badge would call validator.swagger.io
    # (and templates/drf_spectacular/redoc.html drops Redoc's Google Fonts).
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
}

# --- Volt behaviour ----------------------------------------------------------------------------
# How often Volt checks again which peers reach an SSH host directly (inventory/reachability.py).
VOLT_REACHABILITY_RECHECK_S = env_float(
    "VOLT_REACHABILITY_RECHECK_S", 3600.0, minimum=60.0, maximum=7 * 86400.0
)
VOLT_DRIVER_TIMEOUT_S = env_float("VOLT_DRIVER_TIMEOUT_S", 20.0, minimum=1.0, maximum=600.0)
# An SSH host's connection (TCP, banner, key exchange, authentication) is given this long, whatever the
# command timeout: a port that accepts and never answers is not worth the driver's whole timeout.
VOLT_SSH_CONNECT_TIMEOUT_S = env_float("VOLT_SSH_CONNECT_TIMEOUT_S", 10.0, minimum=1.0, maximum=600.0)
VOLT_SSH_KNOWN_HOSTS = env_str("VOLT_SSH_KNOWN_HOSTS", "")
VOLT_GPU_MAX_TEMP_C = env_int("VOLT_GPU_MAX_TEMP_C", 90, minimum=40)
VOLT_HEARTBEAT_STALE_S = env_int("VOLT_HEARTBEAT_STALE_S", 300, minimum=10)
# Provisioning (clusters/provision.py, clusters/provisioning/).
VOLT_PROVISION_ATTEMPTS = env_int("VOLT_PROVISION_ATTEMPTS", 3, minimum=1)
VOLT_AUTO_PROVISION = env_bool("VOLT_AUTO_PROVISION", True)  # off: clusters stop at PROVISIONING
VOLT_PROVISION_STALE_S = env_int("VOLT_PROVISION_STALE_S", 300, minimum=10)
# Recovery (clusters/recovery.py): a DEGRADED cluster is repaired automatically unless this is off.
VOLT_AUTO_RECOVER = env_bool("VOLT_AUTO_RECOVER", True)
VOLT_RECOVERY_ATTEMPTS = env_int("VOLT_RECOVERY_ATTEMPTS", 3, minimum=1)  # replacements that may fail
VOLT_RECOVERY_RETRY_S = env_float("VOLT_RECOVERY_RETRY_S", 15.0, minimum=1.0, maximum=3600.0)
VOLT_RECOVERY_STALE_S = env_int("VOLT_RECOVERY_STALE_S", 300, minimum=10)
VOLT_NODE_JOIN_TIMEOUT_S = env_float("VOLT_NODE_JOIN_TIMEOUT_S", 90.0, minimum=5.0, maximum=3600.0)
# How often a cluster's GCS health-checks its nodes (Ray's health_check_period_ms; Ray's default 3000). A
# raylet that died is declared dead after 5 failed checks: ~5 s here instead of 15-30 s, so recovery
# resumes jobs sooner (the resumed job must not be placed on the dead node). A slow answer is not a failed
# check (Ray's 10 s timeout stays), so a loaded node is not declared dead for being slow.
VOLT_RAY_HEALTH_CHECK_PERIOD_MS = env_int("VOLT_RAY_HEALTH_CHECK_PERIOD_MS", 1000, minimum=100)
VOLT_PROBE_MAX_MB = env_int("VOLT_PROBE_MAX_MB", 256, minimum=1)
VOLT_PROBE_ITERS = env_int("VOLT_PROBE_ITERS", 10, minimum=1)
VOLT_PROBE_TIMEOUT_S = env_float("VOLT_PROBE_TIMEOUT_S", 600.0, minimum=10.0, maximum=7200.0)
# Placement across candidate domains: plans priced at most this fraction above the cheapest count as equal
# and the tightest fit wins. 0 = strict price order, the default: bench/churn.py found no utilisation gain
# from a band over seeds (docs/benchmarks.md "A day of churn"). A one-node request naming no topology level
# has one candidate domain (all hosts), so the band never changes it.
VOLT_PLACEMENT_PRICE_BAND = env_float("VOLT_PLACEMENT_PRICE_BAND", 0.0, minimum=0.0, maximum=1.0)
# A cluster with a requested duration is warned (timeline, page) this long before it ends (clusters/durations.py).
VOLT_DURATION_WARN_S = env_int("VOLT_DURATION_WARN_S", 600, minimum=0, maximum=24 * 3600)
# A collective multi-node request that names no `wait_for_locality` waits up to this long for one site
# before it is placed across sites (clusters/locality.py); 0: never waits unless it asks to.
VOLT_LOCALITY_WAIT_S = env_int("VOLT_LOCALITY_WAIT_S", 1800, minimum=0, maximum=7 * 24 * 3600)
# The queue's first this many requests get a reservation, their start bound, every drain; anything started
# meanwhile leaves their hosts alone unless it ends before (clusters/reservations.py). 0: no reservations,
# plain skip-ahead (a large request can wait for ever behind small ones). 4, not 16: bench/churn.py found
# 16 cost 0.9 point of useful utilisation and 9% of mean wait (hosts held idle for requests far back).
VOLT_QUEUE_RESERVATIONS = env_int("VOLT_QUEUE_RESERVATIONS", 4, minimum=0, maximum=1000)
# A cluster whose measured busbw is below this share of the prediction is flagged.
VOLT_PROBE_MIN_FRACTION = env_float("VOLT_PROBE_MIN_FRACTION", 0.5, minimum=0.0, maximum=1.0)
# A flagged cluster whose probe names one host as the slowest (a figure below this share of the other
# hosts' median) gets that host replaced before READY, up to this many times per cluster (0: never).
VOLT_SLOW_HOST_FRACTION = env_float("VOLT_SLOW_HOST_FRACTION", 0.5, minimum=0.0, maximum=1.0)
VOLT_SLOW_HOST_REPLACEMENTS = env_int("VOLT_SLOW_HOST_REPLACEMENTS", 1, minimum=0)
# The probe (start-up on every host included) runs in about this many seconds: its message sizes follow
# (clusters/probes/allreduce.py). Its per-host phase, when the cluster measures below expectation, comes on top.
VOLT_PROBE_BUDGET_S = env_float("VOLT_PROBE_BUDGET_S", 5.0, minimum=1.0, maximum=3600.0)
# Emulated fabric for local hosts (inventory/fabric_emulation.py): "auto" shapes loopback links between
# local hosts where Volt may configure the network (root / CAP_NET_ADMIN); "off" never does.
VOLT_LOCAL_FABRIC_EMULATION = env_str("VOLT_LOCAL_FABRIC_EMULATION", "auto")
if VOLT_LOCAL_FABRIC_EMULATION not in ("auto", "off"):
    raise ImproperlyConfigured("VOLT_LOCAL_FABRIC_EMULATION must be auto or off")
# Declared GB/s x this = the shaped rate: NDR's 400 GB/s becomes 100 MB/s, under what this machine's
# loopback delivers to the probe (docs/architecture.md, "Emulated fabric").
VOLT_LOCAL_FABRIC_SCALE = env_float("VOLT_LOCAL_FABRIC_SCALE", 0.00025, minimum=1e-7, maximum=1.0)
# The lab (root only; `manage.py lab`, inventory/lab/): each lab's state, machines' disks and shared folder
# live in <VOLT_LAB_DIR>/lab<N>/, removed by `lab down`.
VOLT_LAB_DIR = Path(env_str("VOLT_LAB_DIR", "/var/lib/volt-lab"))
# SSH hosts' shared storage: a folder every SSH host mounts at this same path (NFS, a parallel file system;
# the lab's /mnt/volt-shared). Each cluster's storage (checkpoints: what recovery resumes from on another
# host) is <this>/<cluster's Ray id>, linked from its workdir on every node. "" (default): each host keeps
# its own folder, which dies with the host.
VOLT_SSH_SHARED_DIR = env_str("VOLT_SSH_SHARED_DIR", "")
# Volt's runtime goes to SSH hosts where it may use sudo as one read-only squashfs image (built once on
# the control plane with mksquashfs, copied, loop-mounted under the runtime's venv) instead of pip
# unpacking the wheelhouse on each host: inventory/host_runtime.py. Off: always the wheelhouse.
VOLT_RUNTIME_IMAGE = env_bool("VOLT_RUNTIME_IMAGE", True)
# Where the control plane keeps the runtime's wheelhouse and image ("": under VOLT_DATA_DIR). Built once
# per pin set and read by every worker; the test suite points it at one folder for the whole run.
VOLT_RUNTIME_BUILD_DIR = env_str("VOLT_RUNTIME_BUILD_DIR", "")
# The checkpoint store (issue 27; voltweb/object_store.py): an S3-compatible endpoint with an AWS-style IAM
# API, the bucket Volt keeps checkpoints in, and an identity with admin rights there. Unset: no store (the
# demo and the test run start an embedded SeaweedFS, voltweb/embedded_store.py). Each cluster gets an
# identity of its own, confined by the store to the cluster's prefix.
VOLT_STORE_ENDPOINT = env_str("VOLT_STORE_ENDPOINT", "")
VOLT_STORE_REGION = env_str("VOLT_STORE_REGION", "us-east-1")
VOLT_STORE_BUCKET = env_str("VOLT_STORE_BUCKET", "volt-checkpoints")
VOLT_STORE_ACCESS_KEY = env_str("VOLT_STORE_ACCESS_KEY", "")
VOLT_STORE_SECRET_KEY = env_str("VOLT_STORE_SECRET_KEY", "")
# The store's endpoint as SSH hosts reach it (local hosts use VOLT_STORE_ENDPOINT). Unset: clusters on SSH
# hosts keep checkpoints on their shared storage folder (VOLT_SSH_SHARED_DIR, or each host's own).
VOLT_STORE_NODE_ENDPOINT = env_str("VOLT_STORE_NODE_ENDPOINT", "")
# Ports of the store on this machine that answer without a key (an embedded SeaweedFS's master, volume server,
# filer and gRPC ports): closed to cluster users on local hosts like Volt's own services. The demo and
# scripts/test set it for the store they start.
VOLT_STORE_PRIVATE_PORTS = env_list("VOLT_STORE_PRIVATE_PORTS", [])
if not all(p.isdigit() and 0 < int(p) < 65536 for p in VOLT_STORE_PRIVATE_PORTS):
    raise ImproperlyConfigured("VOLT_STORE_PRIVATE_PORTS must be comma-separated TCP ports (1-65535)")
# Retention in the store (jobs/checkpoints.py): each job keeps its last K synchronized checkpoints (never the
# one it resumed from); an incomplete one (no manifest, a shard missing) goes once older than the latest
# synchronized one, or, after the job ended, once first seen this long ago.
VOLT_CHECKPOINT_KEEP = env_int("VOLT_CHECKPOINT_KEEP", 3, minimum=1)
VOLT_CHECKPOINT_INCOMPLETE_GRACE_S = env_float(
    "VOLT_CHECKPOINT_INCOMPLETE_GRACE_S", 3600.0, minimum=60.0, maximum=30 * 86400.0
)
if VOLT_STORE_ENDPOINT and not (VOLT_STORE_ACCESS_KEY and VOLT_STORE_SECRET_KEY):
    raise ImproperlyConfigured(
        "VOLT_STORE_ENDPOINT is set: set VOLT_STORE_ACCESS_KEY and VOLT_STORE_SECRET_KEY too."
    )
# On SSH hosts where Volt may use sudo, cluster N's Ray runs as a Unix user of its own with uid (and gid)
# <this> + N, the same on every host: they share the storage folder above, and its files are that uid's.
VOLT_SSH_NODE_UID_BASE = env_int(
    "VOLT_SSH_NODE_UID_BASE", 1_500_000_000, minimum=100_000, maximum=2_000_000_000
)
VOLT_LINK_FLAP_PERIOD_S = env_float("VOLT_LINK_FLAP_PERIOD_S", 3.0, minimum=0.5, maximum=600.0)
VOLT_LINK_FLAP_MAX_S = env_float("VOLT_LINK_FLAP_MAX_S", 3600.0, minimum=1.0, maximum=86400.0)
# TCP ports of Volt's own services on this machine that cluster users may not open (local hosts, as root:
# clusters/provisioning/node_firewall.py): the web server's; the database's and Redis's come from their URLs.
VOLT_SERVICE_PORTS = env_list("VOLT_SERVICE_PORTS", ["8000"])
if not all(p.isdigit() and 0 < int(p) < 65536 for p in VOLT_SERVICE_PORTS):
    raise ImproperlyConfigured(
        "VOLT_SERVICE_PORTS must be comma-separated TCP ports (1-65535), e.g. 8000,8443"
    )
VOLT_SERVICE_PORTS = [int(p) for p in VOLT_SERVICE_PORTS]
# SSH hosts run Ray from Volt's runtime, which Volt installs on each over SSH (inventory/host_runtime.py),
# from a wheelhouse built once under VOLT_DATA_DIR/wheelhouse/; local hosts use the local runtime, below.
# The venv local hosts run Ray, the probe and job drivers from (inventory/local_runtime.py; built by
# `manage.py local_runtime`). Empty: /opt/volt/runtime-ray<ray>-torch<torch>-py<x.y> if it exists, else
# Volt's own environment (then a cluster's Unix user cannot be used). Set to a missing folder: refused.
VOLT_LOCAL_RUNTIME = env_str("VOLT_LOCAL_RUNTIME", "")
# The system interpreter the runtime is built from (empty: /usr/bin/python<x.y>, /usr/local/bin/...).
VOLT_LOCAL_RUNTIME_BASE_PYTHON = env_str("VOLT_LOCAL_RUNTIME_BASE_PYTHON", "")
# Telemetry (clusters/telemetry/watch.py, clusters/telemetry/metrics.py, clusters/telemetry/bandwidth_watch.py).
VOLT_WATCH_INTERVAL_S = env_float("VOLT_WATCH_INTERVAL_S", 5.0, minimum=1.0, maximum=3600.0)
VOLT_WATCH_HOST_TIMEOUT_S = env_float("VOLT_WATCH_HOST_TIMEOUT_S", 4.0, minimum=0.5, maximum=600.0)
VOLT_GPU_WARN_TEMP_C = env_int("VOLT_GPU_WARN_TEMP_C", 85, minimum=30)
VOLT_PROBE_INTERVAL_MIN = env_int("VOLT_PROBE_INTERVAL_MIN", 10, minimum=0)  # idle probes; 0: off
VOLT_METRICS_RAW_RETENTION_H = env_int("VOLT_METRICS_RAW_RETENTION_H", 24, minimum=1)
VOLT_METRICS_MINUTE_RETENTION_D = env_int("VOLT_METRICS_MINUTE_RETENTION_D", 30, minimum=1)

# Jobs (jobs/services.py): an uploaded working dir (.zip / .tar.gz) may be this large, compressed and
# unpacked alike; the poller reads live jobs' status, logs and events every VOLT_JOB_POLL_S.
VOLT_JOB_UPLOAD_MAX_MB = env_int("VOLT_JOB_UPLOAD_MAX_MB", 20, minimum=1)
VOLT_JOB_POLL_S = env_float("VOLT_JOB_POLL_S", 2.0, minimum=0.5, maximum=600.0)
VOLT_JOB_LOG_MAX_MB = env_int("VOLT_JOB_LOG_MAX_MB", 16, minimum=1)  # stored per job; the rest is cut
VOLT_JOB_STOP_TIMEOUT_S = env_float("VOLT_JOB_STOP_TIMEOUT_S", 30.0, minimum=1.0, maximum=600.0)
# Request paths that take a multipart upload larger than DATA_UPLOAD_MAX_MEMORY_SIZE (up to the job limit).
VOLT_UPLOAD_PATHS = (r"^/api/v1/jobs/$", r"^/clusters/\d+/jobs/new/$")
VOLT_UPLOAD_MAX_BYTES = VOLT_JOB_UPLOAD_MAX_MB * 1024 * 1024 + 256 * 1024  # the archive + form fields

# The `local` driver (sandbox hosts on this machine, with declared hardware) is for the demo and tests:
# off unless enabled, and then only platform admins add local hosts, unless the second switch (the demo)
# lets provider admins add them too.
VOLT_ALLOW_LOCAL_HOSTS = env_bool("VOLT_ALLOW_LOCAL_HOSTS", False)
VOLT_LOCAL_HOSTS_FOR_PROVIDERS = env_bool("VOLT_LOCAL_HOSTS_FOR_PROVIDERS", False)

# --- accounts and authentication ---------------------------------------------------------------
# API tokens expire this many days after creation unless created with an earlier expiry.
VOLT_TOKEN_LIFETIME_DAYS = env_int("VOLT_TOKEN_LIFETIME_DAYS", 90, minimum=1)
# A live websocket re-reads its user, team membership and (opened with an API token) that token at most
# this often (jittered down to half), with the events it forwards: a revoked token or a removed member
# stops receiving within it.
VOLT_WS_RECHECK_S = env_float("VOLT_WS_RECHECK_S", 30.0, minimum=1.0, maximum=3600.0)
# Failed sign-ins and failed bearer-token authentications are counted in the shared cache per window
# (voltweb/throttle.py); past the limit, attempts are refused (HTTP 429, Retry-After) until it ends.
# Sign-ins count per account from one address (..._PER_ACCOUNT) and per address; a valid bearer token is
# never refused, only failed ones are counted and throttled.
VOLT_AUTH_THROTTLE_WINDOW_S = env_int("VOLT_AUTH_THROTTLE_WINDOW_S", 900, minimum=1)
VOLT_LOGIN_FAILURES_PER_ACCOUNT = env_int("VOLT_LOGIN_FAILURES_PER_ACCOUNT", 10, minimum=1)
VOLT_LOGIN_FAILURES_PER_ADDRESS = env_int("VOLT_LOGIN_FAILURES_PER_ADDRESS", 50, minimum=1)
VOLT_TOKEN_FAILURES_PER_ADDRESS = env_int("VOLT_TOKEN_FAILURES_PER_ADDRESS", 20, minimum=1)
AUTHENTICATION_BACKENDS = ["voltweb.authentication.ThrottledModelBackend"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
