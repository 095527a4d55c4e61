"""Django settings for the benchmark programs and the sender processes they start.

The database comes from BENCH_DATABASE_URL; the source "bench" delivers to a connector that keeps
nothing, and "paced" to the same at Slack's default pace (bench/throughput.py --paced).
BENCH_STORE="orm" makes the senders claim through the ORM store (its --paced comparison).
BENCH_SOURCES (JSON: source name -> CONNECTORS entry) adds sources: bench/rate_limits.py gives
its senders the fake Slack and Discord servers it starts, with their PACE. BENCH_OUTBOX (JSON)
adds other CONNECTOR_OUTBOX keys: bench/soak.py's short RETENTION.
"""

import environ

env = environ.Env()
SECRET_KEY = "bench-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": env.db("BENCH_DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/outbox_bench")
}
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_connector_outbox"]
# No other setting: bench/throughput.py measures the defaults (CLAIM_BATCH and the rest).
CONNECTOR_OUTBOX = {
    "CONNECTORS": {
        # BENCH_BLOCKING=1 (throughput.py --blocking): the same connector with a blocking send.
        "bench": {
            "BACKEND": "bench.connectors."
            + ("BlockingNullConnector" if env.bool("BENCH_BLOCKING", default=False) else "NullConnector")
        },
        "paced": {"BACKEND": "bench.connectors.PacedNullConnector"},
        **env.json("BENCH_SOURCES", default={}),
    },
    "STORE": env("BENCH_STORE", default="auto"),
    **env.json("BENCH_OUTBOX", default={}),
}
LOGGING = {"version": 1, "loggers": {"django_connector_outbox": {"level": "WARNING"}}}
