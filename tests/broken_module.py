"""A connector module that cannot be imported (for the E003 check test)."""

raise RuntimeError("this module fails as it is imported")
