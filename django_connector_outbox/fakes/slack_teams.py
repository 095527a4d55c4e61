"""Teams, tokens and OAuth for the fake Slack (`django_connector_outbox.fakes.slack.FakeSlack` holds one `Accounts`).

What it keeps as Slack does:
- A team (workspace) has its own installation of the app and its own tokens; an Enterprise Grid
  org-wide installation has tokens of the enterprise, valid for channels of every team in it.
- `oauth.v2.access` (client_id/client_secret in the form or with HTTP Basic, as slack-sdk sends
  them): `grant_type=authorization_code` exchanges a code the fake issued (one time: a reused,
  expired or unknown code is `invalid_code`, the only code error Slack documents for the method;
  a different `redirect_uri` than the authorize request's is `bad_redirect_uri`), and
  `grant_type=refresh_token` rotates: a new access token AND a new refresh token, the used
  refresh token answering `invalid_refresh_token` afterwards. Slack's token rotation guide says
  the refresh token "is then revoked", and says nothing of revoking the access token it replaced:
  that one keeps working until its own `expires_in` (12 hours at Slack, `expires_in` here), then
  answers `token_expired` (ok:false, HTTP 200).
- Revocation: the tokens of a revoked or uninstalled team answer `token_revoked` (or the error
  given, e.g. `account_inactive`), unknown tokens `invalid_auth`. A new installation (a code
  exchanged later) gets new tokens that work.

What it records for tests (all of it safe to print: token ids, never token values):
- each token has an id, `<owner>/<generation>` (owner: the team, or the enterprise of an org-wide
  install; generation counts the access tokens issued to that owner), so a test can count the
  tokens used per team;
- `refreshes[owner]`: refresh grants answered with new tokens;
- `wrong_team_calls`: calls addressing a channel of a team the token does not serve (answered
  `channel_not_found`, as Slack answers for a channel it cannot see);
- `expired_token_calls`: calls made with an expired token after a newer token of its owner was
  issued (the client had a fresh token and used the old one);
- `stale_token_calls`: calls made with a still valid token after a newer one was issued.

Not thread-safe by itself: `FakeSlack` calls it under its lock.
"""

from __future__ import annotations

import itertools
import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

CLIENT_ID = "1111111111.2222222222"
CLIENT_SECRET = "fake-client-secret-0123456789abcdef"
APP_ID = "AFAKEAPP1"
# Slack's lifetime of a rotating token: 12 hours.
EXPIRES_IN = 43200
# "Authorization codes ... expire after ten minutes" (Slack's OAuth guide).
CODE_LIFETIME = 600
DEFAULT_SCOPES = "chat:write,chat:write.public,reactions:write,channels:history,groups:history"


class SlackError(Exception):
    """An `{"ok": false, "error": code}` answer; `details` are the answer's other keys."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code
        self.details: dict[str, Any] = {}


@dataclass
class Team:
    id: str
    name: str
    enterprise_id: str | None = None
    domain: str = ""
    rotation: bool = False
    expires_in: int = EXPIRES_IN
    bot_user_id: str = ""
    bot_id: str = ""


@dataclass
class Enterprise:
    id: str
    name: str
    teams: list[str] = field(default_factory=list)
    rotation: bool = False
    expires_in: int = EXPIRES_IN
    bot_user_id: str = ""
    bot_id: str = ""


@dataclass
class Token:
    """One token Slack issued. `owner`: a team id, or an enterprise id for an org-wide install."""

    value: str
    id: str
    owner: str
    kind: str  # "bot", "user" or "refresh"
    generation: int
    issued_at: float
    expires_at: float | None = None
    revoked: str = ""  # the error its use answers once revoked
    used: bool = False  # a refresh token, once exchanged


@dataclass
class Code:
    value: str
    owner: str
    org: bool
    user: str
    scopes: str
    user_scopes: str
    redirect_uri: str
    expires_at: float
    used: bool = False


class Accounts:
    """The fake's teams, enterprises, installations, tokens and codes."""

    def __init__(self, *, client_id: str = CLIENT_ID, client_secret: str = CLIENT_SECRET) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.teams: dict[str, Team] = {}
        self.enterprises: dict[str, Enterprise] = {}
        self.tokens: dict[str, Token] = {}  # value -> token
        self.codes: dict[str, Code] = {}
        self.generations: Counter[str] = Counter()  # owner -> access tokens issued
        self.scopes: dict[str, str] = {}  # owner -> the installed bot scopes
        self.installer: dict[str, str] = {}  # owner -> the user who installed
        self.refreshes: Counter[str] = Counter()
        self.wrong_team_calls: list[JSON] = []
        self.expired_token_calls: list[JSON] = []
        self.stale_token_calls: list[JSON] = []
        self._serial = itertools.count(1)

    # -- set-up

    def add_team(
        self,
        team_id: str,
        *,
        name: str = "",
        enterprise_id: str | None = None,
        rotation: bool = False,
        expires_in: int = EXPIRES_IN,
    ) -> Team:
        suffix = team_id[1:] if team_id[:1] == "T" else team_id
        team = Team(
            team_id,
            name=name or f"Team {team_id}",
            enterprise_id=enterprise_id,
            domain=f"team-{team_id.lower()}",
            rotation=rotation,
            expires_in=expires_in,
            bot_user_id=f"UB{suffix}",
            bot_id=f"BB{suffix}",
        )
        self.teams[team_id] = team
        if enterprise_id is not None:
            self.add_enterprise(enterprise_id, teams=[team_id])
        return team

    def add_enterprise(
        self,
        enterprise_id: str,
        *,
        name: str = "",
        teams: list[str] | tuple[str, ...] = (),
        rotation: bool = False,
        expires_in: int = EXPIRES_IN,
    ) -> Enterprise:
        """An Enterprise Grid org; its `teams` are created when new (and joined to it)."""
        org = self.enterprises.get(enterprise_id)
        if org is None:
            suffix = enterprise_id[1:] if enterprise_id[:1] == "E" else enterprise_id
            org = Enterprise(
                enterprise_id,
                name=name or f"Org {enterprise_id}",
                rotation=rotation,
                expires_in=expires_in,
                bot_user_id=f"UE{suffix}",
                bot_id=f"BE{suffix}",
            )
            self.enterprises[enterprise_id] = org
        elif name:
            org.name = name
        for team_id in teams:
            if team_id not in self.teams:
                self.add_team(team_id)
            self.teams[team_id].enterprise_id = enterprise_id
            if team_id not in org.teams:
                org.teams.append(team_id)
        return org

    def add_token(self, owner: str, value: str, now: float) -> Token:
        """Register a given, non-expiring bot token of `owner` (the single-token fake's)."""
        return self._token(owner, "bot", now, value=value)

    # -- installing

    def issue_code(
        self,
        now: float,
        *,
        team: str,
        user: str = "UINSTALLER1",
        enterprise: bool = False,
        scopes: str = DEFAULT_SCOPES,
        user_scopes: str = "",
        redirect_uri: str = "",
    ) -> str:
        """A code for the OAuth redirect: `team` installs the app (or, with `enterprise`, an admin
        of `team` (or the enterprise id itself) installs it org-wide)."""
        owner = team
        if enterprise:
            owner = team if team in self.enterprises else (self._team(team).enterprise_id or "")
            if owner not in self.enterprises:
                raise ValueError(f"{team} is in no enterprise: no org-wide install")
        else:
            self._team(team)
        value = f"{next(self._serial)}.{secrets.token_hex(16)}"
        self.codes[value] = Code(
            value,
            owner=owner,
            org=enterprise,
            user=user,
            scopes=scopes,
            user_scopes=user_scopes,
            redirect_uri=redirect_uri,
            expires_at=now + CODE_LIFETIME,
        )
        return value

    def install(
        self,
        owner: str,
        now: float,
        *,
        user: str = "UINSTALLER1",
        scopes: str = DEFAULT_SCOPES,
        user_scopes: str = "",
    ) -> JSON:
        """Install the app in a team (or org-wide in an enterprise): new tokens, and the answer
        `oauth.v2.access` gives for them (without "ok")."""
        self.scopes[owner] = scopes
        self.installer[owner] = user
        answer = self._grant(owner, now)
        authed_user: JSON = {"id": user}
        if user_scopes:
            user_token = self._token(owner, "user", now, generation=self.generations[owner])
            authed_user.update(scope=user_scopes, access_token=user_token.value, token_type="user")
        answer["authed_user"] = authed_user
        return answer

    def oauth_v2_access(self, args: JSON, basic: tuple[str, str] | None, now: float) -> JSON:
        """Answer `oauth.v2.access` (raises SlackError with Slack's code)."""
        client_id, client_secret = basic or (
            str(args.get("client_id", "")),
            str(args.get("client_secret", "")),
        )
        if client_id != self.client_id:
            raise SlackError("invalid_client_id")
        if client_secret != self.client_secret:
            raise SlackError("bad_client_secret")
        grant_type = str(args.get("grant_type") or "authorization_code")
        if grant_type == "authorization_code":
            return self._exchange(args, now)
        if grant_type == "refresh_token":
            return self._refresh(str(args.get("refresh_token", "")), now)
        raise SlackError("invalid_grant_type")

    def _exchange(self, args: JSON, now: float) -> JSON:
        code = self.codes.get(str(args.get("code", "")))
        if code is None or code.used or now >= code.expires_at:
            raise SlackError("invalid_code")
        if code.redirect_uri and str(args.get("redirect_uri", "")) != code.redirect_uri:
            raise SlackError("bad_redirect_uri")
        code.used = True
        return self.install(code.owner, now, user=code.user, scopes=code.scopes, user_scopes=code.user_scopes)

    def _refresh(self, value: str, now: float) -> JSON:
        token = self.tokens.get(value)
        if token is None or token.kind != "refresh" or token.used or token.revoked:
            raise SlackError("invalid_refresh_token")
        token.used = True  # rotation: the refresh token is revoked once exchanged
        self.refreshes[token.owner] += 1
        return self._grant(token.owner, now)

    def _grant(self, owner: str, now: float) -> JSON:
        """New access (and, with rotation, refresh) tokens for `owner`, as oauth.v2.access answers."""
        place = self._owner(owner)
        org = isinstance(place, Enterprise)
        team = None if org else self._team(owner)
        enterprise = (
            self.enterprises[owner] if team is None else self.enterprises.get(team.enterprise_id or "")
        )
        generation = self.generations[owner] + 1
        self.generations[owner] = generation
        expires_at = now + place.expires_in if place.rotation else None
        access = self._token(owner, "bot", now, generation=generation, expires_at=expires_at)
        answer: JSON = {
            "access_token": access.value,
            "token_type": "bot",
            "scope": self.scopes.get(owner, DEFAULT_SCOPES),
            "bot_user_id": place.bot_user_id,
            "app_id": APP_ID,
            # An org-wide installation belongs to no team.
            "team": None if team is None else {"id": team.id, "name": team.name},
            "enterprise": None if enterprise is None else {"id": enterprise.id, "name": enterprise.name},
            "is_enterprise_install": org,
        }
        if place.rotation:
            refresh = self._token(owner, "refresh", now, generation=generation)
            answer.update(refresh_token=refresh.value, expires_in=place.expires_in)
        return answer

    def _token(
        self,
        owner: str,
        kind: str,
        now: float,
        *,
        generation: int | None = None,
        expires_at: float | None = None,
        value: str | None = None,
    ) -> Token:
        if generation is None:
            generation = self.generations[owner] = self.generations[owner] + 1
        if value is None:
            rotating = self._owner(owner).rotation
            prefix = {"bot": "xoxb", "user": "xoxp", "refresh": "xoxe"}[kind]
            # Slack's rotating access tokens are "xoxe.xoxb-1-...", refresh tokens "xoxe-1-...".
            if kind == "refresh":
                value = f"xoxe-1-{owner}-{generation}-{secrets.token_hex(12)}"
            else:
                value = f"{'xoxe.' if rotating else ''}{prefix}-{owner}-{generation}-{secrets.token_hex(12)}"
        suffix = {"bot": "", "user": "u", "refresh": "r"}[kind]
        token = Token(
            value,
            id=f"{owner}/{generation}{suffix}",
            owner=owner,
            kind=kind,
            generation=generation,
            issued_at=now,
            expires_at=expires_at,
        )
        self.tokens[value] = token
        return token

    # -- revoking and expiring

    def revoke(self, owner: str, error: str = "token_revoked") -> int:
        """Every token of `owner` issued so far answers `error` (refresh: invalid_refresh_token);
        returns how many were revoked."""
        self._owner(owner)
        revoked = [t for t in self.tokens.values() if t.owner == owner and not t.revoked]
        for token in revoked:
            token.revoked = error
        return len(revoked)

    def expire(self, owner: str, now: float) -> int:
        """Every expiring access token of `owner` expires now; returns how many."""
        expiring = [
            t
            for t in self.tokens.values()
            if t.owner == owner and t.kind != "refresh" and t.expires_at is not None and t.expires_at > now
        ]
        for token in expiring:
            token.expires_at = now
        return len(expiring)

    # -- checking calls

    def authenticate(self, value: str | None, method: str, now: float) -> Token:
        """The token a Web API call is made with, or SlackError with Slack's answer; records
        uses of a superseded token."""
        if not value:
            raise SlackError("not_authed")
        token = self.tokens.get(value)
        if token is None or token.kind == "refresh":
            raise SlackError("invalid_auth")
        if token.revoked:
            raise SlackError(token.revoked)
        superseded = token.kind == "bot" and token.generation < self.generations[token.owner]
        record = {"method": method, "token": token.id, "owner": token.owner, "at": now}
        if token.expires_at is not None and now >= token.expires_at:
            if superseded:
                self.expired_token_calls.append(record)
            raise SlackError("token_expired")
        if superseded:
            self.stale_token_calls.append(record)
        return token

    def identify(self, value: str | None) -> tuple[str, str]:
        """(owner, token id) of a token, ("", "") if unknown: for the call records."""
        token = self.tokens.get(value or "")
        return ("", "") if token is None else (token.owner, token.id)

    def serves(self, token: Token, team_id: str) -> bool:
        """Whether `token` may address a channel of `team_id`."""
        if token.owner == team_id:
            return True
        org = self.enterprises.get(token.owner)
        return org is not None and team_id in org.teams

    def wrong_team(self, token: Token, method: str, channel: str, team_id: str) -> None:
        self.wrong_team_calls.append(
            {
                "method": method,
                "channel": channel,
                "channel_team": team_id,
                "token": token.id,
                "owner": token.owner,
            }
        )

    def auth_test(self, token: Token, base_url: str) -> JSON:
        org = self.enterprises.get(token.owner)
        if org is not None:
            # An org-wide token: Slack names the enterprise as its team.
            return {
                "url": f"https://{org.id.lower()}.enterprise.slack.com/",
                "team": org.name,
                "user": "fakebot",
                "team_id": org.id,
                "user_id": org.bot_user_id,
                "bot_id": org.bot_id,
                "enterprise_id": org.id,
                "is_enterprise_install": True,
            }
        team = self._team(token.owner)
        answer: JSON = {
            "url": f"https://{team.domain}.slack.com/",
            "team": team.name,
            "user": "fakebot",
            "team_id": team.id,
            "user_id": team.bot_user_id if token.kind == "bot" else self.installer.get(team.id, ""),
            "is_enterprise_install": False,
        }
        if token.kind == "bot":
            answer["bot_id"] = team.bot_id
        if team.enterprise_id:
            answer["enterprise_id"] = team.enterprise_id
        return answer

    def teams_list(self, token: Token) -> JSON:
        org = self.enterprises.get(token.owner)
        ids = list(org.teams) if org is not None else [token.owner]
        return {
            "teams": [{"id": t, "name": self.teams[t].name} for t in ids],
            "response_metadata": {"next_cursor": ""},
        }

    def state(self) -> JSON:
        """The records, and each owner's tokens by id (never their values)."""
        return {
            "teams": {
                t.id: {"name": t.name, "enterprise_id": t.enterprise_id, "rotation": t.rotation}
                for t in self.teams.values()
            },
            "enterprises": {
                e.id: {"name": e.name, "teams": list(e.teams)} for e in self.enterprises.values()
            },
            "tokens": [
                {
                    "id": t.id,
                    "owner": t.owner,
                    "kind": t.kind,
                    "expires_at": t.expires_at,
                    "revoked": t.revoked,
                    "used": t.used,
                }
                for t in self.tokens.values()
            ],
            "refreshes": dict(self.refreshes),
            "wrong_team_calls": list(self.wrong_team_calls),
            "expired_token_calls": list(self.expired_token_calls),
            "stale_token_calls": list(self.stale_token_calls),
        }

    # -- lookups

    def _team(self, team_id: str) -> Team:
        team = self.teams.get(team_id)
        if team is None:
            raise ValueError(f"no team {team_id!r}")
        return team

    def _owner(self, owner: str) -> Team | Enterprise:
        place = self.teams.get(owner) or self.enterprises.get(owner)
        if place is None:
            raise ValueError(f"no team or enterprise {owner!r}")
        return place
