"""Fake platforms on 127.0.0.1, for end-to-end tests of a project that uses the outbox.

What anymail's test backend is for email: real HTTP, real connectors, no network.
`webhook.FakeWebhook` is a webhook receiver that verifies signatures, honours idempotency
keys, answers lookups and can be scripted to fail, rate-limit or lose its replies; `base` is
the plumbing every fake shares (a threaded server, scripted actions, the platforms' limits).
They import nothing but the standard library, so a test may run them in a process of its own
(``python -m django_connector_outbox.fakes.webhook``).
"""
