"""Shared pytest configuration."""

pytest_plugins = ["awaken_langchain.testing.pytest_plugin"]
