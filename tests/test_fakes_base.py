"""The request helpers the REST fakes share (django_connector_outbox/fakes/base.py)."""

from __future__ import annotations

import re

import pytest

from django_connector_outbox.fakes.base import match_route, parse_json

ROUTES = [
    ("GET", re.compile(r"^/channels/(?P<channel>[^/]+)/messages$"), "list"),
    ("POST", re.compile(r"^/channels/(?P<channel>[^/]+)/messages$"), "create"),
]


def test_a_route_is_matched_by_method_and_path_with_its_groups_decoded():
    assert match_route(ROUTES, "POST", "/channels/a%2Fb/messages") == ("create", {"channel": "a/b"})


@pytest.mark.parametrize(("method", "path"), [("PUT", "/channels/c/messages"), ("GET", "/channels/c")])
def test_no_route_matches_another_method_or_path(method, path):
    assert match_route(ROUTES, method, path) is None


@pytest.mark.parametrize(
    ("raw", "parsed"), [(b'{"a": 1}', {"a": 1}), (b"[]", []), (b"", "empty"), (b"{not json", "invalid")]
)
def test_a_body_is_read_as_json_or_said_to_be_empty_or_invalid(raw, parsed):
    assert parse_json(raw, empty="empty", invalid="invalid") == parsed


def test_an_invalid_body_is_an_ellipsis_by_default():
    assert parse_json(b"{not json") is ...
