"""Fake platforms on 127.0.0.1, for local work and end-to-end tests of a project that uses the outbox.

What anymail's test backend is for email, over real HTTP: `slack` (with many workspaces and the
"Add to Slack" flow, `slack_teams`), `discord`, `google_chat`, `mattermost`, `teams`, `telegram`
and `webhook` answer as their platforms do, refuse the bodies their platforms refuse
(`block_kit`, `discord_form`, `adaptive_card`, `telegram_html`: the schemas and limits, with the
platforms' own errors), record what they received and can be scripted to fail, rate-limit or
lose their replies; `base` is the plumbing every fake shares (a threaded server, scripted
actions, the platforms' limits, the command line). They import nothing but the standard
library (and `google_chat` the package's own `cryptography`, for its service account's key), so
each runs in a process of its own: ``python -m django_connector_outbox.fakes.NAME
[--port P]`` prints its URL and the settings to paste. In tests, the package's pytest plugin has
a fixture for each (`fake_slack` ... `fake_webhook`).
"""
