"""Checkpoint store backends.

Local stores are importable from here; the Redis store lives in
``awaken_langchain.stores.redis`` so that importing this package never needs redis.
"""
