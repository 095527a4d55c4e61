"""Slack, Discord, Telegram and Teams connectors that note when each post they are handed was claimed.

bench/rate_limits.py checks its paces against claim times, which no row keeps once a post is
delivered (a claim lives on its lane while it lasts): the sender processes write them to a
file instead (tests/proof_connectors.NotesClaims, OPTIONS ``claims``).
"""

from __future__ import annotations

from django_connector_outbox.connectors.discord import DiscordConnector
from django_connector_outbox.connectors.slack import SlackConnector
from django_connector_outbox.connectors.teams import TeamsConnector
from django_connector_outbox.connectors.telegram import TelegramConnector
from tests.proof_connectors import NotesClaims


class NotingSlackConnector(NotesClaims, SlackConnector):
    pass


class NotingDiscordConnector(NotesClaims, DiscordConnector):
    pass


class NotingTelegramConnector(NotesClaims, TelegramConnector):
    pass


class NotingTeamsConnector(NotesClaims, TeamsConnector):
    pass
