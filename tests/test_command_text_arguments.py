"""Every management command refuses an id or name argument that is not valid text, naming it.

Bytes on a command line that are not UTF-8 reach Python as lone surrogates ("p\\udcff" for
b"p\\xff"), which no database stores: the commands refuse them, and NUL, as the Outbox refuses
them in a post (a CommandError, exit status 1), rather than dying on a UnicodeEncodeError.
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from tests.harness import manage

pytestmark = pytest.mark.django_db

NOT_UTF8 = "contains a lone surrogate ('\\udcff'), which is not UTF-8"
NUL = "contains a NUL character (\\x00), which PostgreSQL cannot store"

# (the command's arguments, what the error names); "{}" stands for the bad id.
ARGUMENTS = [
    (["outbox_cancel", "{}"], "POST_ID"),
    (["outbox_retry", "{}"], "POST_ID"),
    (["outbox_cancel", "--container", "{}"], "--container"),
    (["outbox_retry", "--container", "{}"], "--container"),
    (["outbox_retry", "--source", "{}"], "--source"),
    (["outbox_status", "--source", "{}"], "--source"),
    (["outbox_prune", "--source", "{}"], "--source"),
    (["run_outbox", "--once", "--source", "{}"], "--source"),
    (["run_outbox", "--once", "--worker", "{}"], "--worker"),
    (["outbox_status", "--database", "{}"], "--database"),
    (["run_outbox", "--once", "--database", "{}"], "--database"),
]


# transaction=True: SQLite's test transaction would hold the write lock the command's checks wait for.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "named"),
    [
        ([b"outbox_cancel", b"p\xff"], "POST_ID 'p\\udcff'"),
        ([b"outbox_retry", b"--container", b"c\xff"], "--container 'c\\udcff'"),
        ([b"run_outbox", b"--once", b"--source", b"s\xff"], "--source 's\\udcff'"),
    ],
    ids=["outbox_cancel", "outbox_retry", "run_outbox"],
)
def test_bytes_that_are_not_utf8_on_the_command_line_are_refused_without_a_traceback(args, named):
    done = manage(str(connection.settings_dict["NAME"]), *args)
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert f"CommandError: {named} is not valid text: it {NOT_UTF8}" in stderr


@pytest.mark.parametrize(
    ("args", "named"), ARGUMENTS, ids=lambda a: " ".join(a) if isinstance(a, list) else a
)
@pytest.mark.parametrize(("bad", "flaw"), [("x\udcff", NOT_UTF8), ("x\x00y", NUL)], ids=["surrogate", "nul"])
def test_an_id_argument_that_no_database_stores_is_a_command_error_naming_it(args, named, bad, flaw):
    with pytest.raises(CommandError) as refused:
        call_command(*[bad if arg == "{}" else arg for arg in args], verbosity=0)
    assert str(refused.value) == f"{named} {ascii(bad)} is not valid text: it {flaw}"
