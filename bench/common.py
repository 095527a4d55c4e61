"""Shared set-up of the benchmark programs: a dedicated database, Django, and table resets."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/outbox_bench"


def setup(database_url: str) -> None:
    """Create the database if needed, configure Django on it and migrate."""
    os.environ["BENCH_DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    sys.path.insert(0, str(ROOT))
    url = urlparse(database_url)
    if url.scheme.startswith("postgres"):
        import psycopg

        admin = url._replace(path="/postgres").geturl()
        with psycopg.connect(admin, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [url.path[1:]]).fetchone():
                conn.execute(f'CREATE DATABASE "{url.path[1:]}"')
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def reset_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("TRUNCATE django_connector_outbox_post, django_connector_outbox_lane")
        else:
            cursor.execute("DELETE FROM django_connector_outbox_post")
            cursor.execute("DELETE FROM django_connector_outbox_lane")
