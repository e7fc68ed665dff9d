"""Benchmarks: programs that print ratios measured side by side in one run.

Run one with ``python -m benchmarks.<name>`` or all with ``python -m benchmarks``.
"""
