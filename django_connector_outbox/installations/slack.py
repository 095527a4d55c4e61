"""slack-sdk's InstallationStore over the outbox's installations, so that a Bolt app (events,
slash commands, the OAuth flow) and the outbox's senders share one table.

One row per (source, workspace): a team's install, or an Enterprise Grid org-wide install
under its enterprise id. The row holds the latest installation of the workspace; its
installer's user token is kept with it (a user token of anyone else is not kept, so
`find_installation(user_id=...)` of another user finds nothing). Deleting marks the row
revoked (secrets erased) rather than removing it: the outbox's posts to that workspace then
fail with a reason that says to install the app again, until someone does.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from slack_sdk.oauth.installation_store import Bot, Installation, InstallationStore

from django_connector_outbox.installations.store import REFRESH_TOKEN, TOKEN, Installations
from django_connector_outbox.models import Installation as Row

logger = logging.getLogger("django_connector_outbox.installations")

#: Secrets of a Slack installation besides the bot's (TOKEN, REFRESH_TOKEN).
USER_TOKEN = "user_token"
USER_REFRESH_TOKEN = "user_refresh_token"
WEBHOOK_URL = "incoming_webhook_url"
#: What `extra` keeps of an installation: not secret, needed to give it back whole.
EXTRA_FIELDS = (
    "enterprise_url",
    "incoming_webhook_channel",
    "incoming_webhook_channel_id",
    "incoming_webhook_configuration_url",
    "user_token_expires_at",
    "custom_values",
)


class SlackInstallationStore(InstallationStore):
    """The installations of `source` as slack-sdk's `InstallationStore`."""

    def __init__(self, source: str, *, using: str | None = None) -> None:
        self.source = source
        self.installations = Installations(source, using=using, cache_seconds=0)

    @property
    def logger(self) -> logging.Logger:
        return logger

    # -- saving

    def save(self, installation: Installation) -> None:
        """Save the workspace's installation, installed when slack-sdk says: a new one's
        `installed_at` is when it was made (an OAuth flow's end), and a copy of one found here
        (Bolt's token rotation saves one back) keeps the row's, so that "installed" is the
        latest install, never a token rotation."""
        workspace_id = _workspace(
            installation.enterprise_id, installation.team_id, installation.is_enterprise_install
        )
        extra = {
            name: getattr(installation, name) for name in EXTRA_FIELDS if getattr(installation, name, None)
        }
        self.installations.save(
            workspace_id,
            secrets={
                TOKEN: installation.bot_token or "",
                REFRESH_TOKEN: installation.bot_refresh_token or "",
                USER_TOKEN: installation.user_token or "",
                USER_REFRESH_TOKEN: installation.user_refresh_token or "",
                WEBHOOK_URL: installation.incoming_webhook_url or "",
            },
            enterprise_id=installation.enterprise_id or "",
            is_enterprise_install=bool(installation.is_enterprise_install),
            team_name=installation.team_name or "",
            enterprise_name=installation.enterprise_name or "",
            app_id=installation.app_id or "",
            bot_id=installation.bot_id or "",
            bot_user_id=installation.bot_user_id or "",
            bot_scopes=",".join(installation.bot_scopes or ()),
            installer_user_id=installation.user_id or "",
            user_scopes=",".join(installation.user_scopes or ()),
            token_type=installation.token_type or "",
            token_issued_at=_datetime(installation.installed_at),
            token_expires_at=_datetime(installation.bot_token_expires_at),
            installed_at=_datetime(installation.installed_at) or self.installations.clock(),
            extra=extra,
        )

    def save_bot(self, bot: Bot) -> None:
        """Replace the bot's part of the workspace's installation (Bolt calls it after rotating)."""
        workspace_id = _workspace(bot.enterprise_id, bot.team_id, bot.is_enterprise_install)
        row = self._row(workspace_id)
        secrets = self.installations.secrets_of(row) if row is not None and row.revoked_at is None else {}
        secrets.update({TOKEN: bot.bot_token or "", REFRESH_TOKEN: bot.bot_refresh_token or ""})
        # New tokens, not a new install: the row keeps the time it was installed.
        installed = {"installed_at": row.installed_at} if row is not None else {}
        self.installations.save(
            workspace_id,
            secrets=secrets,
            enterprise_id=bot.enterprise_id or "",
            is_enterprise_install=bool(bot.is_enterprise_install),
            team_name=bot.team_name or "",
            enterprise_name=bot.enterprise_name or "",
            app_id=bot.app_id or "",
            bot_id=bot.bot_id or "",
            bot_user_id=bot.bot_user_id or "",
            bot_scopes=",".join(bot.bot_scopes or ()),
            token_issued_at=_datetime(bot.installed_at),
            token_expires_at=_datetime(bot.bot_token_expires_at),
            **installed,
        )

    # -- finding

    def find_bot(
        self, *, enterprise_id: str | None, team_id: str | None, is_enterprise_install: bool | None = False
    ) -> Bot | None:
        row = self._find(enterprise_id, team_id, is_enterprise_install)
        if row is None:
            return None
        secrets = self.installations.secrets_of(row)
        return Bot(
            app_id=row.app_id or None,
            enterprise_id=row.enterprise_id or None,
            enterprise_name=row.enterprise_name or None,
            team_id=None if row.is_enterprise_install else row.workspace_id,
            team_name=row.team_name or None,
            bot_token=secrets.get(TOKEN, ""),
            bot_id=row.bot_id,
            bot_user_id=row.bot_user_id,
            bot_scopes=row.bot_scopes,
            bot_refresh_token=secrets.get(REFRESH_TOKEN),
            bot_token_expires_at=_epoch(row.token_expires_at),
            is_enterprise_install=row.is_enterprise_install,
            installed_at=row.installed_at.timestamp(),
        )

    def find_installation(
        self,
        *,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None = None,
        is_enterprise_install: bool | None = False,
    ) -> Installation | None:
        row = self._find(enterprise_id, team_id, is_enterprise_install)
        if row is None or (user_id is not None and user_id != row.installer_user_id):
            return None
        secrets = self.installations.secrets_of(row)
        extra = dict(row.extra)
        extra.pop("team_ids", None)
        return Installation(
            app_id=row.app_id or None,
            enterprise_id=row.enterprise_id or None,
            enterprise_name=row.enterprise_name or None,
            team_id=None if row.is_enterprise_install else row.workspace_id,
            team_name=row.team_name or None,
            bot_token=secrets.get(TOKEN),
            bot_id=row.bot_id or None,
            bot_user_id=row.bot_user_id or None,
            bot_scopes=row.bot_scopes,
            bot_refresh_token=secrets.get(REFRESH_TOKEN),
            bot_token_expires_at=_epoch(row.token_expires_at),
            user_id=row.installer_user_id,
            user_token=secrets.get(USER_TOKEN),
            user_scopes=row.user_scopes,
            user_refresh_token=secrets.get(USER_REFRESH_TOKEN),
            incoming_webhook_url=secrets.get(WEBHOOK_URL),
            is_enterprise_install=row.is_enterprise_install,
            token_type=row.token_type or None,
            installed_at=row.installed_at.timestamp(),
            **{name: extra[name] for name in EXTRA_FIELDS if name in extra},
        )

    # -- deleting: a revocation the outbox's posts see

    def delete_bot(self, *, enterprise_id: str | None, team_id: str | None) -> None:
        self._revoke(enterprise_id, team_id, "the bot token was revoked (delete_bot)")

    def delete_installation(
        self, *, enterprise_id: str | None, team_id: str | None, user_id: str | None = None
    ) -> None:
        if user_id is not None:
            # A user revoked their own token (tokens_revoked): the bot's installation stays.
            self._forget_user_token(enterprise_id, team_id, user_id)
            return
        self._revoke(enterprise_id, team_id, "the app was uninstalled (delete_installation)")

    def delete_all(self, *, enterprise_id: str | None, team_id: str | None) -> None:
        self._revoke(enterprise_id, team_id, "the app was uninstalled (delete_all)")

    # -- internals

    def _row(self, workspace_id: str) -> Row | None:
        return self.installations.rows().filter(workspace_id=workspace_id).first()  # type: ignore[no-any-return]

    def _find(
        self, enterprise_id: str | None, team_id: str | None, is_enterprise_install: bool | None
    ) -> Row | None:
        """The usable row for Bolt's query: a team's own, else its enterprise's org-wide one."""
        candidates = [_workspace(enterprise_id, team_id, is_enterprise_install)]
        if enterprise_id and candidates[0] != enterprise_id:
            candidates.append(enterprise_id)
        for workspace_id in candidates:
            row = self._row(workspace_id)
            if row is not None and row.revoked_at is None and row.secrets:
                if workspace_id == enterprise_id and not row.is_enterprise_install and team_id:
                    continue
                return row
        return None

    def _revoke(self, enterprise_id: str | None, team_id: str | None, reason: str) -> None:
        row = self._find(enterprise_id, team_id, is_enterprise_install=not team_id)
        if row is not None:
            self.installations.revoke(row.workspace_id, reason)

    def _forget_user_token(self, enterprise_id: str | None, team_id: str | None, user_id: str) -> None:
        row = self._find(enterprise_id, team_id, is_enterprise_install=not team_id)
        if row is None or row.installer_user_id != user_id:
            return
        secrets = self.installations.secrets_of(row)
        secrets.pop(USER_TOKEN, None)
        secrets.pop(USER_REFRESH_TOKEN, None)
        fields = {
            f.name: getattr(row, f.name)
            for f in Row._meta.concrete_fields
            if f.name not in ("id", "source", "workspace_id", "secrets", "revoked_at", "revoked_reason")
            and f.name not in ("refresh_error", "updated_at")
        }
        self.installations.save(row.workspace_id, secrets=secrets, **fields)


def _workspace(enterprise_id: str | None, team_id: str | None, is_enterprise_install: bool | None) -> str:
    """The workspace id of a Slack installation: its team, or its enterprise if org-wide."""
    workspace_id = enterprise_id if is_enterprise_install or not team_id else team_id
    if not workspace_id:
        raise ValueError("a Slack installation needs a team_id, or an enterprise_id if org-wide")
    return workspace_id


def _datetime(value: Any) -> datetime | None:
    """slack-sdk's timestamps (epoch seconds, int or float) as an aware datetime."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromtimestamp(float(value), tz=UTC)


def _epoch(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())
