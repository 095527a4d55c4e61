"""What the Slack connector and its installations' tokens (slack_installations.py) both use:
the grant a send's calls are made with, and Slack's error code and text. Its own module so
that the two import it, not each other."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from slack_sdk import WebClient
from slack_sdk.web import SlackResponse
from slack_sdk.web.async_slack_response import AsyncSlackResponse

# Slack's error codes are snake_case words; anything else in `error` is slack-sdk's own text
# for a body that was not JSON (an HTML error page from a proxy or load balancer).
_ERROR_CODE = re.compile(r"[a-z0-9_.]+")


@dataclass
class Grant:
    """What one send's calls are made with: a client for its token (the blocking door's; the
    coroutine door passes the token to its loop's client) and, with installations,
    the credentials of the post's workspace (None with a plain token). `secrets`: everything
    to scrub from the text of an error. `renewed`: its token was replaced once in this send."""

    workspace_id: str
    client: WebClient = field(repr=False)
    token: str = field(repr=False)
    credentials: Any = field(repr=False, default=None)  # installations.Credentials
    secrets: tuple[str, ...] = field(repr=False, default=())
    renewed: bool = False

    def use(self, other: Grant) -> None:
        self.client, self.token, self.credentials, self.secrets = (
            other.client,
            other.token,
            other.credentials,
            other.secrets,
        )
        self.renewed = True


def error_code(response: SlackResponse | AsyncSlackResponse) -> str | None:
    """Slack's error code in an ok:false answer, or None when the answer is not Slack's JSON."""
    data = response.data if isinstance(response.data, dict) else {}
    code = data.get("error")
    return code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else None


def text_of(error: BaseException | str) -> str:
    """An error as text for a reason (to scrub before it is shown)."""
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return str(error)
