"""Shared set-up of the benchmark programs: a dedicated database, Django, and table resets."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/outbox_bench"


def create_database(database_url: str) -> None:
    """Create the PostgreSQL or MySQL/MariaDB database if it is missing (SQLite makes its file)."""
    url = urlparse(database_url)
    name = url.path[1:]
    if url.scheme.startswith("postgres"):
        import psycopg

        admin = url._replace(path="/postgres").geturl()
        with psycopg.connect(admin, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')
    elif url.scheme.startswith("mysql"):
        import MySQLdb

        conn = MySQLdb.connect(host=url.hostname, port=url.port or 3306, user=url.username or "root",
                               password=url.password or "")  # fmt: skip
        conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        conn.close()


def setup(database_url: str) -> None:
    """Create the database if needed, configure Django on it and migrate."""
    os.environ["BENCH_DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    sys.path.insert(0, str(ROOT))
    create_database(database_url)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def reset_tables() -> None:
    """Empty every table of the app, whatever tables the current code has (as `flush` does)."""
    from django.apps import apps
    from django.core.management.color import no_style
    from django.db import connection

    tables = [model._meta.db_table for model in apps.get_app_config("django_connector_outbox").get_models()]
    connection.ops.execute_sql_flush(connection.ops.sql_flush(no_style(), tables, allow_cascade=True))


def drain_arguments(doc: str | None) -> argparse.ArgumentParser:
    """The arguments of the programs that drain N posts over K containers: the database, -n, -k."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("-n", type=int, default=20_000, help="posts (20000)")
    parser.add_argument("-k", type=int, default=1_000, help="containers (1000)")
    return parser


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: user, nice, system,
    irq, softirq and steal), every process counted: the database server's too."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
