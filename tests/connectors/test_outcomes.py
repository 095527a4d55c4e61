"""The outcomes' rate-limit vocabulary: scopes, and the hold a delivery can carry."""

from __future__ import annotations

import logging

import pytest

from django_connector_outbox.connectors import Connector, Delivered, Hold, RateLimited, Scope


def test_a_rate_limit_holds_the_container_unless_told_otherwise() -> None:
    assert RateLimited(5).scope is Scope.CONTAINER
    assert RateLimited(5, "slow down") == RateLimited(after=5, reason="slow down", scope="container")


@pytest.mark.parametrize("scope", ["container", "workspace", "source"])
def test_a_scope_given_as_text_becomes_the_scope(scope: str) -> None:
    assert RateLimited(5, "", scope).scope is Scope(scope)
    assert Hold(5, "", scope).scope is Scope(scope)


@pytest.mark.parametrize("outcome", [RateLimited, Hold])
def test_an_unknown_scope_holds_the_container_and_says_so(
    outcome: type, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_connector_outbox.connectors"):
        made = outcome(3, "HTTP 429", scope="team")

    assert (made.after, made.reason, made.scope) == (
        3,
        "HTTP 429 (unknown scope 'team': held the container)",
        Scope.CONTAINER,
    )
    assert [r.getMessage() for r in caplog.records] == [
        "unknown rate-limit scope 'team' from a connector: held the container"
    ]


def test_an_unknown_scope_without_a_reason_gets_one() -> None:
    assert RateLimited(3, scope=None).reason == "(unknown scope None: held the container)"  # type: ignore[arg-type]


def test_a_delivery_is_built_as_before_and_may_carry_a_hold() -> None:
    assert Delivered("m1") == Delivered(message_ref="m1", hold=None)
    assert Delivered().message_ref is None
    held = Delivered("m1", Hold(2.5, "bucket empty"))
    assert held.hold == Hold(after=2.5, reason="bucket empty", scope=Scope.CONTAINER)


def test_the_base_connector_paces_nothing() -> None:
    assert Connector.pace == {}
