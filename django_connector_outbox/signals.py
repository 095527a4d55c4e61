"""Signals (filled in by the sender)."""
