"""Shared pytest configuration."""
