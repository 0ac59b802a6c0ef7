"""Settings of gpustack-models, read only from environment variables.

Every variable is parsed by a small typed helper that raises ``ImproperlyConfigured`` naming the
variable when its value is malformed, so a bad deployment fails at start rather than at first use.
The defaults are the embedded local ones: SQLite, a file-based Celery broker and the local control
plane's kubeconfig under ``GPUSTACK_DATA_DIR``.
"""

import importlib.util
from datetime import timedelta

import dj_database_url

from gpustack_models import env_vars
from gpustack_models.env_vars import (
    BASE_DIR,
    ImproperlyConfigured,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_ports,
    env_renamed,
    env_str,
    env_url,
)

# --- Core ------------------------------------------------------------------------------------------
DATA_DIR = env_vars.data_dir()
# A checkout with the development tools (the local control plane, `runlocal`, the tests); never the image.
LOCAL_TOOLS = importlib.util.find_spec("gpustack_models.local") is not None
LOCAL_SECRET_KEY = "insecure-local-only-change-me-in-any-deployment"
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not LOCAL_TOOLS:
        raise ImproperlyConfigured("SECRET_KEY is required: the built-in key is for local runs of a checkout only")
    SECRET_KEY = LOCAL_SECRET_KEY
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["*"])

INSTALLED_APPS = [
    "gpustack_models.console.apps.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "axes",  # the console's sign-in throttling; installed in every role so that migrate makes its tables
    "gpustack_models",
]
# Development tools (the local control plane, `runlocal`): in a checkout, not in the image.
if LOCAL_TOOLS:
    INSTALLED_APPS.append("gpustack_models.local")

# Which server this process is: "api" (the aggregated API on gunicorn's ASGI worker) runs no middleware:
# each sync middleware costs the ASGI handler a thread hop per request, and the API authenticates and
# authorizes in its views. "console" is the admin console (sessions, CSRF, messages).
SERVER_ROLE = env_str("GPUSTACK_SERVER_ROLE", "console")
if SERVER_ROLE not in ("console", "api"):
    raise ImproperlyConfigured(f"GPUSTACK_SERVER_ROLE={SERVER_ROLE!r}: expected console or api")

MIDDLEWARE = (
    []
    if SERVER_ROLE == "api"
    else [
        "django.middleware.security.SecurityMiddleware",
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
        "axes.middleware.AxesMiddleware",  # last: turns a refused sign-in into the lockout page
    ]
)

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

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
            ],
            "libraries": {"console": "gpustack_models.console.tags"},
        },
    },
]

# --- Database: SQLite by default, anything dj-database-url reads otherwise -------------------------
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'gpustack-models.sqlite3'}")
try:
    # Connections are kept (CONN_MAX_AGE) and checked before their first query of a request or task
    # (CONN_HEALTH_CHECKS): one PostgreSQL dropped (a restart, a failover) is replaced, not failed on.
    _database = dj_database_url.parse(
        DATABASE_URL, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0), conn_health_checks=True
    )
except Exception as exc:  # dj-database-url raises bare ValueError/KeyError on unknown schemes
    raise ImproperlyConfigured(f"DATABASE_URL={DATABASE_URL!r}: {exc}") from None
if _database["ENGINE"] not in ("django.db.backends.sqlite3", "django.db.backends.postgresql"):
    raise ImproperlyConfigured(f"DATABASE_URL={DATABASE_URL!r}: only sqlite and postgres are supported")
if _database["ENGINE"] == "django.db.backends.sqlite3":
    # The informers and Celery write concurrently; wait for the lock instead of failing at once.
    _database.setdefault("OPTIONS", {}).update(
        timeout=20,
        # Readers never wait for writers; writers take the lock when their transaction starts.
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        transaction_mode="IMMEDIATE",
    )
    # A test database other processes (the Celery worker) can open too.
    _database["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Celery: a file-based broker by default, Redis (or any kombu URL) otherwise ---------------------
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL", "filesystem://localhost/", {"filesystem", "redis", "rediss", "amqp", "memory"}
)
CELERY_BROKER_DIR = DATA_DIR / "celery" / "broker"
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_BROKER_DIR / "queue"),
        "data_folder_out": str(CELERY_BROKER_DIR / "queue"),
        "processed_folder": str(CELERY_BROKER_DIR / "processed"),
        "control_folder": str(CELERY_BROKER_DIR / "control"),
        "store_processed": False,
        # A Celery worker's loop notices a stop between polls: a short interval lets it stop in seconds.
        "polling_interval": 0.2,
    }
    _default_results = f"file://{DATA_DIR / 'celery' / 'results'}"
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
    _default_results = CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis", "rediss")) else "rpc://"
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", _default_results)
# Reconcilers report through Kubernetes and the mirror, not through results; storing each one would
# cost a broker round trip per event.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a task lost with its worker is delivered again; tasks are idempotent
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Stopping: SIGTERM lets running tasks finish for this many seconds, then cancels those left, which the
# broker delivers again (acks_late); see config/celery.py. A lost broker connection cancels them too, as
# the broker redelivers them anyway.
TASKS_SHUTDOWN_GRACE_SECONDS = env_float("GPUSTACK_CELERY_SHUTDOWN_GRACE_SECONDS", 5.0, minimum=0)
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# A pool process whose peak resident memory passed this many MB is replaced by a fresh one once its task ends
# (Celery's worker_max_memory_per_child, in KiB): under a steady load the pool processes grow (the README's
# Reliability section), and the worker Pod's memory limit must not be what stops them. 0: never replaced.
CELERY_WORKER_MAX_MEMORY_PER_CHILD = env_int("GPUSTACK_CELERY_MAX_MEMORY_PER_CHILD_MB", 256, minimum=0) * 1024 or None

# --- Kubernetes ------------------------------------------------------------------------------------
# KUBECONFIG unset: in-cluster credentials when running in a Pod, the local control plane's otherwise.
KUBECONFIG = env_vars.kubeconfig()
LOCAL_KUBECONFIG = DATA_DIR / "kubeconfig"
KUBE_REQUEST_TIMEOUT = env_vars.kube_request_timeout()
KUBE_VERSION_FILE = BASE_DIR / "deploy" / "controlplane" / "go.mod"
# Compaction interval passed to the local kube-apiserver (Go duration); short values exercise 410 Expired.
ETCD_COMPACTION_INTERVAL = env_str("GPUSTACK_ETCD_COMPACTION_INTERVAL", "5m")
# The local control plane's ports (`make run`): kube-apiserver, etcd client, etcd peer,
# kube-controller-manager, kube-scheduler; or "free" for free loopback ports picked at each start.
LOCAL_CLUSTER_PORTS = env_ports("GPUSTACK_LOCAL_CLUSTER_PORTS", "6443,12379,12380,10257,10259", "five")
# `make run`'s metrics ports of the informers, the Celery worker and Celery beat (plain HTTP on 127.0.0.1), or
# "free" for free loopback ports picked at each start; runlocal lists them in <data dir>/endpoints.json.
LOCAL_METRICS_PORTS = env_ports("GPUSTACK_LOCAL_METRICS_PORTS", "9101,9102,9103", "three")

# --- The aggregated API server ---------------------------------------------------------------------
# Seconds a TokenReview or SubjectAccessReview answer is reused.
AUTH_CACHE_TTL = env_vars.auth_cache_ttl()
# At most this many answers kept per cache (TokenReviews; SubjectAccessReviews): the oldest go first.
AUTH_CACHE_SIZE = env_int("GPUSTACK_AUTH_CACHE_SIZE", 16384, minimum=1)
# Where the service's objects live and who it is; the admission policies name these accounts. The service's
# ServiceAccount keeps its first name, gpustack-models-worker (an installed account is not renamed);
# GPUSTACK_WORKER_SERVICE_ACCOUNT is the deprecated name of its variable.
NAMESPACE = env_str("GPUSTACK_NAMESPACE", "gpustack-system")
SERVICE_ACCOUNT = env_str(
    env_renamed("GPUSTACK_SERVICE_ACCOUNT", "GPUSTACK_WORKER_SERVICE_ACCOUNT"), "gpustack-models-worker"
)
PLUGIN_SERVICE_ACCOUNT = env_str("GPUSTACK_PLUGIN_SERVICE_ACCOUNT", "gpustack-models-plugin")
API_SERVICE_NAME = env_str("GPUSTACK_API_SERVICE", "gpustack-models-api")
API_PORT = env_vars.api_port()
API_BIND = env_list("GPUSTACK_API_BIND", [f"127.0.0.1:{API_PORT}", f"[::1]:{API_PORT}"])
API_WORKERS = env_int("GPUSTACK_API_WORKERS", 2, minimum=1)
# Threads per API worker process for request handling (an open watch holds none).
API_THREADS = env_int("GPUSTACK_API_THREADS", 64, minimum=1)
# Who calls the placement webhook: the user kube-apiserver's admission configuration authenticates as
# (a client certificate of the cluster's client CA); RBAC lets exactly this user post to it.
PLACEMENT_CALLER = env_str("GPUSTACK_PLACEMENT_CALLER", "kube-apiserver-admission")
# How the placement webhook learns where a Pod's models are. clientCertificate (the default): kube-apiserver
# authenticates with the client certificate of its AdmissionConfiguration (GPUSTACK_PLACEMENT_CALLER) and
# the webhook names the nodes holding each artifact, from the mirror. nodeLabels, for control planes whose
# webhook client credentials cannot be set (EKS, GKE, AKS): the Celery worker labels each Node with one
# label per artifact it holds Ready (gpustack_models.kinds.placement_labels) and the webhook, open to any
# caller, answers with a pure function of the request (prefer nodes with those labels), reading nothing.
# Trade-off: whoever may read Nodes can test whether a guessed namespace/name is held on a node; a Node
# carries one label per artifact it holds; placement follows a label write. Any other mode removes the
# labels the worker wrote (while it may still patch Nodes).
PLACEMENT_MODES = ("clientCertificate", "nodeLabels")
PLACEMENT_MODE = env_str("GPUSTACK_PLACEMENT_MODE", "clientCertificate")
if PLACEMENT_MODE not in PLACEMENT_MODES:
    raise ImproperlyConfigured(
        f"GPUSTACK_PLACEMENT_MODE={PLACEMENT_MODE!r}: expected one of {', '.join(PLACEMENT_MODES)}"
    )
# How often (seconds) Celery beat compares every Node's placement labels with what it holds, and fixes
# those that differ (a safety net for lost events; in a mode other than nodeLabels, it removes them).
PLACEMENT_LABELS_RESYNC_SECONDS = env_float("GPUSTACK_PLACEMENT_LABELS_RESYNC_SECONDS", 60.0, minimum=0.5)
TLS_CERT_FILE = env_str("GPUSTACK_TLS_CERT_FILE", str(DATA_DIR / "api-pki" / "serving.crt"))
TLS_KEY_FILE = env_str("GPUSTACK_TLS_KEY_FILE", str(DATA_DIR / "api-pki" / "serving.key"))

# --- The reconcilers -------------------------------------------------------------------------------
# Label of the node plugin's Pods (the DaemonSet's, or those the local launcher registers).
PLUGIN_SELECTOR = env_str("GPUSTACK_PLUGIN_SELECTOR", "app.kubernetes.io/name=gpustack-models-plugin")
# Hubs: the variables the hubs' own clients read, passed to them explicitly.
HF_ENDPOINT = env_url("HF_ENDPOINT", "https://huggingface.co", {"http", "https"}).rstrip("/")
MODELSCOPE_ENDPOINT = env_url("MODELSCOPE_ENDPOINT", "https://www.modelscope.cn", {"http", "https"}).rstrip("/")
HUB_PROXY = env_str("GPUSTACK_HUB_PROXY", "")
HUB_CA_BUNDLE = env_str("GPUSTACK_HUB_CA_BUNDLE", "")
HUB_TIMEOUT = env_float("GPUSTACK_HUB_TIMEOUT", 30.0, minimum=1.0)
# OCI registries: those reached over plain HTTP (``host`` or ``host:port``, as container runtimes' insecure
# registries), whether a reference must be pinned by digest (a tag is refused: ReferenceNotPinned), and the
# platform whose manifest an image index gives.
OCI_INSECURE_REGISTRIES = tuple(env_list("GPUSTACK_OCI_INSECURE_REGISTRIES"))
OCI_REQUIRE_DIGEST = env_bool("GPUSTACK_OCI_REQUIRE_DIGEST", False)
OCI_PLATFORM = env_str("GPUSTACK_OCI_PLATFORM", "linux/amd64")
# S3 sources: how long (seconds) the pre-signed links of a fetch ticket stay valid (a download that outlives
# them asks for a new ticket and resumes).
S3_LINK_SECONDS = env_int("GPUSTACK_S3_LINK_SECONDS", 3600, minimum=60, maximum=7 * 24 * 3600)
# Backoff of a resolution that failed for a reason that may pass (hub down, Secret or claim missing).
RESOLVE_RETRY_BASE = env_float("GPUSTACK_RESOLVE_RETRY_BASE", 5.0, minimum=0.1)
RESOLVE_RETRY_MAX = env_float("GPUSTACK_RESOLVE_RETRY_MAX", 300.0, minimum=0.1)
# Backoff (seconds) of a resolution that failed for a reason only a person fixes (AccessDenied,
# RevisionNotFound, EmptyManifest...): tried again after the base, doubling per failure up to the max.
RESOLVE_TERMINAL_RETRY_BASE = env_float("GPUSTACK_RESOLVE_TERMINAL_RETRY_BASE", 300.0, minimum=1.0)
RESOLVE_TERMINAL_RETRY_MAX = env_float("GPUSTACK_RESOLVE_TERMINAL_RETRY_MAX", 21600.0, minimum=1.0)
# How often (seconds) the Secrets named by failed artifacts are read to see whether they changed (a changed
# token is tried at once), and at most how many Secrets one pass reads.
SECRET_CHECK_INTERVAL_SECONDS = env_float("GPUSTACK_SECRET_CHECK_INTERVAL_SECONDS", 30.0, minimum=1.0)
SECRET_CHECK_BATCH = env_int("GPUSTACK_SECRET_CHECK_BATCH", 200, minimum=1)
# Kubernetes Events: repeats within the series window (seconds) update one Event; each object may get a
# burst of new Events, then one more per refill interval (seconds), as Kubernetes' own controllers do.
EVENT_SERIES_SECONDS = env_float("GPUSTACK_EVENT_SERIES_SECONDS", 600.0, minimum=1.0)
EVENT_BURST = env_int("GPUSTACK_EVENT_BURST", 25, minimum=1)
EVENT_REFILL_SECONDS = env_float("GPUSTACK_EVENT_REFILL_SECONDS", 300.0, minimum=0.001)
# Each namespace's share of the hubs: resolution attempts per minute, and how many may start at once.
RESOLVE_NAMESPACE_RATE = env_float("GPUSTACK_RESOLVE_NAMESPACE_RATE", 30.0, minimum=0.1)
RESOLVE_NAMESPACE_BURST = env_int("GPUSTACK_RESOLVE_NAMESPACE_BURST", 10, minimum=1)
# What every NodeModelStore's spec asks of its node.
STORE_HIGH_PERCENT = env_int("GPUSTACK_STORE_HIGH_PERCENT", 80, minimum=1, maximum=100)
STORE_LOW_PERCENT = env_int("GPUSTACK_STORE_LOW_PERCENT", 70, minimum=0, maximum=100)
DOWNLOAD_CONCURRENCY = env_int("GPUSTACK_DOWNLOAD_CONCURRENCY", 8, minimum=1, maximum=256)
DOWNLOAD_BYTES_PER_SECOND = env_int("GPUSTACK_DOWNLOAD_BYTES_PER_SECOND", 0, minimum=0)
# The peer endpoints' upload limits every store's spec asks of its node: transfers at once, bytes per second (0: none).
UPLOAD_CONNECTIONS = env_int("GPUSTACK_UPLOAD_CONNECTIONS", 8, minimum=1, maximum=1024)
UPLOAD_BYTES_PER_SECOND = env_int("GPUSTACK_UPLOAD_BYTES_PER_SECOND", 0, minimum=0)

# The node plugin, as the API reaches it: its HTTPS port on the plugin Pod's IP, and the CA its
# serving certificates are checked against.
PLUGIN_PORT = env_vars.plugin_port()
PLUGIN_CA_FILE = env_vars.plugin_ca_file(DATA_DIR)
if SERVER_ROLE == "api" and not PLUGIN_CA_FILE:
    # progress reads the plugins over HTTPS, always verified: there is no setting that turns that off.
    raise ImproperlyConfigured("GPUSTACK_PLUGIN_CA_FILE is empty: the API checks the plugins' certificates against it")
# (API) The plugin CA's private key: the API signs each plugin's serving certificate for its Pod IP with it
# (POST /internal/v1/plugin-certificates). Only the API's Pods hold it, never a node; empty or missing: the
# endpoint answers 503. The certificates it issues are valid this many seconds (plugins renew at 2/3).
PLUGIN_CA_KEY_FILE = env_str("GPUSTACK_PLUGIN_CA_KEY_FILE", str(DATA_DIR / "plugin-pki" / "ca.key"))
PLUGIN_CERT_SECONDS = env_int("GPUSTACK_PLUGIN_CERT_SECONDS", 7 * 24 * 3600, minimum=30, maximum=366 * 24 * 3600)
# (API) The CA certificates nodes trust, published for them in a ConfigMap of GPUSTACK_NAMESPACE holding no key:
# `api-ca.crt` from GPUSTACK_API_SERVING_CA_FILE (the CA of the API's serving certificate, e.g. the ca.crt of
# a cert-manager Secret) and `plugin-ca.crt` from GPUSTACK_PLUGIN_CA_FILE, at start and whenever either file
# changes. Empty (the default): nothing is published (the chart renders the ConfigMap itself).
CA_CONFIGMAP = env_str("GPUSTACK_CA_CONFIGMAP", "")
API_SERVING_CA_FILE = env_str("GPUSTACK_API_SERVING_CA_FILE", "")
if SERVER_ROLE == "api" and CA_CONFIGMAP and not API_SERVING_CA_FILE:
    raise ImproperlyConfigured(
        "GPUSTACK_CA_CONFIGMAP is set: GPUSTACK_API_SERVING_CA_FILE must name the API's serving CA"
    )
# Each plugin gets a client certificate with its serving one (same validity); the API makes its own from the
# CA key for its live reads of the plugins (an hour, renewed at 2/3). No token is ever sent to a node.
# Peer fan-out: the plugins' peer port (service and plugin; 0: no peer server, no peers in tickets), and
# whether tickets list nodes still downloading a digest.
PLUGIN_PEER_PORT = env_vars.plugin_peer_port()
PEER_DOWNLOADING_ALLOWED = env_bool("GPUSTACK_PEER_DOWNLOADING_ALLOWED", True)
TICKET_PEERS_MAX = env_int("GPUSTACK_TICKET_PEERS_MAX", 16, minimum=0)
# progress: live reads of at most this many downloading nodes, each within the timeout, the whole
# answer within the deadline (seconds).
PROGRESS_LIVE_MAX = env_int("GPUSTACK_PROGRESS_LIVE_MAX", 64, minimum=0)
PROGRESS_LIVE_TIMEOUT = env_float("GPUSTACK_PROGRESS_LIVE_TIMEOUT", 2.0, minimum=0.1)
PROGRESS_DEADLINE = env_float("GPUSTACK_PROGRESS_DEADLINE", 13.0, minimum=1.0)

# The node plugin's own variables are read by the plugin (gpustack_models/plugin/environment.py).

# --- The informers --------------------------------------------------------------------------------------
# Watch events are coalesced per object (the latest state wins) and sent as one Celery task per resource
# when the oldest is this many seconds old or this many objects are buffered; a size of 1: one task per event.
INFORMER_BATCH_SECONDS = env_float("GPUSTACK_INFORMER_BATCH_SECONDS", 0.05, minimum=0.0)
INFORMER_BATCH_SIZE = env_int("GPUSTACK_INFORMER_BATCH_SIZE", 500, minimum=1, maximum=10000)
# (Celery worker) a file to append one JSON line per mirrored event to: when it reached the informer, when
# its row committed (empty: none is written).
MIRROR_LAG_FILE = env_str("GPUSTACK_MIRROR_LAG_FILE", "")

# --- Metrics -----------------------------------------------------------------------------------------
# The plain HTTP port (and address) where the informers, the Celery worker and Celery beat serve GET /metrics
# (0: not served). The API serves its metrics on its own HTTPS port, to authorized callers only.
METRICS_PORT = env_int("GPUSTACK_METRICS_PORT", 0, minimum=0, maximum=65535)
METRICS_ADDRESS = env_str("GPUSTACK_METRICS_ADDRESS", "0.0.0.0")
# The metrics port's bounds: at most this many connections open at once (one accepted beyond is closed at once,
# unread), and the seconds a request's line and headers have to arrive whole (however slowly they trickle) and
# its answer to be written whole. A keep-alive connection waits 75 s for its next request.
METRICS_MAX_CONNECTIONS = env_int("GPUSTACK_METRICS_MAX_CONNECTIONS", 32, minimum=1)
METRICS_REQUEST_SECONDS = env_float("GPUSTACK_METRICS_REQUEST_SECONDS", 10.0, minimum=0.1)
# --- Leader election (several replicas of the informers and of Celery beat) ------------------------------
# Only the holder of a coordination.k8s.io Lease in GPUSTACK_NAMESPACE acts; the others stand by (false: every
# process acts at once, for a single replica that may not read or write Leases).
LEADER_ELECTION = env_bool("GPUSTACK_LEADER_ELECTION", True)
# A standby takes over a Lease its holder has not renewed for this many seconds (as this standby observed it).
LEADER_LEASE_SECONDS = env_float("GPUSTACK_LEADER_LEASE_SECONDS", 15.0, minimum=1.0)
# A leader that could not renew its Lease for this many seconds stops acting (the informers exit non-zero).
LEADER_RENEW_DEADLINE_SECONDS = env_float("GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS", 10.0, minimum=0.2)
# Seconds between a leader's renewals and between a standby's tries.
LEADER_RETRY_SECONDS = env_float("GPUSTACK_LEADER_RETRY_SECONDS", 2.0, minimum=0.1)
if not LEADER_LEASE_SECONDS > LEADER_RENEW_DEADLINE_SECONDS > LEADER_RETRY_SECONDS:
    raise ImproperlyConfigured(
        "GPUSTACK_LEADER_LEASE_SECONDS > GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS > GPUSTACK_LEADER_RETRY_SECONDS must "
        f"hold (now {LEADER_LEASE_SECONDS} / {LEADER_RENEW_DEADLINE_SECONDS} / {LEADER_RETRY_SECONDS})"
    )
# The Leases' names (two installations sharing a namespace need their own).
LEADER_INFORMERS_LEASE = env_str("GPUSTACK_LEADER_INFORMERS_LEASE", "gpustack-models-informers")
LEADER_BEAT_LEASE = env_str("GPUSTACK_LEADER_BEAT_LEASE", "gpustack-models-beat")

# --- The cache's lifecycle --------------------------------------------------------------------------------
# A digest nothing references on a node leaves that node's spec.models after this many seconds.
COLLECTION_GRACE_SECONDS = env_float("GPUSTACK_COLLECTION_GRACE_SECONDS", 600.0, minimum=0.0)
# How often Celery beat runs the collection pass (seconds).
COLLECTION_INTERVAL_SECONDS = env_float("GPUSTACK_COLLECTION_INTERVAL_SECONDS", 60.0, minimum=0.5)
# How often Celery beat checks that the Pods of mount references still exist (seconds).
MOUNT_CHECK_INTERVAL_SECONDS = env_float("GPUSTACK_MOUNT_CHECK_INTERVAL_SECONDS", 60.0, minimum=0.5)
# Bytes one namespace's prefetches may place on one node (0: no limit); a Namespace's annotation
# worker.gpustack.ai/prefetch-bytes-per-node, set by administrators, overrides it.
PREFETCH_BYTES_PER_NODE = env_int("GPUSTACK_PREFETCH_BYTES_PER_NODE", 0, minimum=0)
# Distinct digests one namespace's prefetches may place on one node (0: no limit; the prefetches past it
# are QuotaExceeded there; mounts are never limited); a Namespace's annotation
# worker.gpustack.ai/prefetch-digests-per-node, set by administrators, overrides it. The default, a quarter
# of the per-node cap, keeps one namespace from taking every place on a node.
PREFETCH_DIGESTS_PER_NODE = env_int("GPUSTACK_PREFETCH_DIGESTS_PER_NODE", 64, minimum=0)
# The most digests one node's spec.models holds: mounted, then pinned, then the oldest references (the
# prefetches left out are NodeFull). At most the schema's limit of spec.models (256), the default.
MODELS_PER_NODE = env_int("GPUSTACK_MODELS_PER_NODE", 256, minimum=1, maximum=256)

CELERY_BEAT_SCHEDULE = {
    "collect-every-interval": {"task": "gpustack_models.collect", "schedule": COLLECTION_INTERVAL_SECONDS},
    "check-mounts-every-interval": {"task": "gpustack_models.check_mounts", "schedule": MOUNT_CHECK_INTERVAL_SECONDS},
    "retry-failed-resolutions-every-30s": {"task": "gpustack_models.retry_failed_resolutions", "schedule": 30.0},
    "check-resolution-secrets": {
        "task": "gpustack_models.check_resolution_secrets",
        "schedule": SECRET_CHECK_INTERVAL_SECONDS,
    },
    "resync-node-stores-every-1m": {"task": "gpustack_models.resync_node_stores", "schedule": 60.0},
    "resync-placement-labels": {
        "task": "gpustack_models.resync_placement_labels",
        "schedule": PLACEMENT_LABELS_RESYNC_SECONDS,
    },
    "purge-tombstones-every-10m": {"task": "gpustack_models.purge_tombstones", "schedule": 600.0},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celery" / "beat-schedule")
# Beat sends its tasks only while it holds the beat Lease (GPUSTACK_LEADER_ELECTION).
CELERY_BEAT_SCHEDULER = "gpustack_models.reconcilers.beat_leader:LeaderScheduler"

# --- Web -------------------------------------------------------------------------------------------
# The console behind HTTPS (a TLS-terminating ingress sets X-Forwarded-Proto): cookies only over HTTPS.
CONSOLE_HTTPS = env_bool("GPUSTACK_CONSOLE_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = CONSOLE_HTTPS
SESSION_COOKIE_HTTPONLY = True
if CONSOLE_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # Plain HTTP is answered with a redirect to HTTPS, and browsers are told to keep to HTTPS this long.
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = env_int("GPUSTACK_CONSOLE_HSTS_SECONDS", 3600, minimum=0)
# HSTS for subdomains and the browsers' preload list are the domain's owner's decisions, not the console's.
SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021"]
if SERVER_ROLE == "api":
    # The API serves no console page (its URLs have none), so it runs without the console's middleware.
    SILENCED_SYSTEM_CHECKS += ["admin.E408", "admin.E409", "admin.E410", "axes.W002"]

# The console's sign-in (django-axes). Failed sign-ins are counted per username and client address, in the
# database every console replica shares (SQLite or PostgreSQL; migrate makes the tables). After
# GPUSTACK_CONSOLE_LOGIN_FAILURES failures that pair is refused for GPUSTACK_CONSOLE_LOCKOUT_SECONDS from the last
# counted failure: a 429 page with Retry-After, even with the right password, which is then never checked. Attempts
# while refused are not counted (the refusal ends on time); a successful sign-in clears the pair's count.
# `manage.py axes_reset_username NAME` (or `axes_reset`) lifts refusals at once.
CONSOLE_LOGIN_FAILURES = env_int("GPUSTACK_CONSOLE_LOGIN_FAILURES", 5, minimum=1)
CONSOLE_LOCKOUT_SECONDS = env_int("GPUSTACK_CONSOLE_LOCKOUT_SECONDS", 900, minimum=1)
# The client address is the connection's peer (REMOTE_ADDR; behind kubectl port-forward that is the Pod's own
# loopback, the same for every user). X-Forwarded-For is read only on a connection from one of
# GPUSTACK_CONSOLE_TRUSTED_PROXIES (comma-separated addresses or CIDR networks: the Ingress controller's Pods): the
# client is then the right-most address of that header that is not a trusted proxy. Empty, the default: the header
# is ignored, whoever sends it.
CONSOLE_TRUSTED_PROXIES = env_networks("GPUSTACK_CONSOLE_TRUSTED_PROXIES")
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = CONSOLE_LOGIN_FAILURES
AXES_COOLOFF_TIME = timedelta(seconds=CONSOLE_LOCKOUT_SECONDS)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "gpustack_models.console.client_ip.client_ip"
AXES_LOCKOUT_CALLABLE = "gpustack_models.console.lockout.locked_out"
AXES_ENABLE_ADMIN = False  # the console stays read-only: refusals are lifted with the management commands
AXES_DISABLE_ACCESS_LOG = True  # no row per successful sign-in (a table nothing would prune)
AXES_VERBOSE = False
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"  # the formats below print times with a Z
FORMAT_MODULE_PATH = ["config.formats"]
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# The console's few static files are served by WhiteNoise straight from the apps (no collectstatic step).
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "UNAUTHENTICATED_USER": None,
    "EXCEPTION_HANDLER": "gpustack_models.api.status.exception_handler",
}
# kube-apiserver's own request body limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = 3 * 1024 * 1024

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": env_vars.LOG_FORMAT}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_vars.log_level()},
    "loggers": {
        **{name: {"level": "WARNING"} for name in env_vars.QUIET_LOGGERS},
        # Every 4xx is a Status the client reads; logging each one as a warning is noise.
        "django.request": {"level": "ERROR"},
    },
}
