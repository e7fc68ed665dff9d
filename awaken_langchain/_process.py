"""This process's id, kept up to date across ``fork`` without a system call per read."""

from __future__ import annotations

import os

PROCESS = [os.getpid()]
"""``PROCESS[0]`` is this process's id (``os.getpid`` is a system call, and the
checkpoint writer and the DiskCache store look at it on every write)."""

os.register_at_fork(after_in_child=lambda: PROCESS.__setitem__(0, os.getpid()))
