"""Test kits a user runs against their own components (needs pytest).

:class:`StoreConformanceTests` is the checkpoint store contract as pytest tests:
subclass it, give it a ``make_store`` fixture, and pytest runs every rule the
project's own stores keep against your store.
"""

# ruff: noqa: E402
import pytest

# Rewrite the kit's asserts so that a failing store shows the values compared.
pytest.register_assert_rewrite("awaken_langchain.testing.conformance.stores")

from awaken_langchain.testing.conformance.stores import SettableClock, StoreConformanceTests

__all__ = ["SettableClock", "StoreConformanceTests"]
