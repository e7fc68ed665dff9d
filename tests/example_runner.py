"""Run documentation examples, each in a forked copy of one warm interpreter.

Importing LangChain, LangGraph and the SDKs costs seconds per interpreter; this
process imports them once, then reads one JSON job per line from stdin (the
example's source, where it comes from, its environment and working directory),
forks a child per job and answers one JSON line: the child's exit status and
its output. Each example still starts from a clean slate: its own process, its
own environment, globals and event loops.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback
import types

PRELOAD = (
    "langchain_openai",
    "langchain_anthropic",
    "langchain.agents",
    "langgraph.graph",
    "awaken_langchain",
    "awaken_langchain.middleware",
    "awaken_langchain.testing.server",
)


def run_child(job: dict[str, object], output: int) -> None:
    """In the forked child: set up the example's world and run it."""
    os.dup2(output, 1)
    os.dup2(output, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the jobs' pipe stays the runner's
    os.environ.clear()
    os.environ.update(job["env"])  # type: ignore[arg-type]
    os.chdir(str(job["cwd"]))
    status = 0
    try:
        code = compile(str(job["source"]), str(job["where"]), "exec")
        main = types.ModuleType("__main__")  # as `python -c` runs it: typing looks it up
        sys.modules["__main__"] = main
        exec(code, main.__dict__)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run(job: dict[str, object]) -> dict[str, object]:
    """Fork a child for ``job``, wait for it (up to its timeout) and collect its output."""
    with tempfile.TemporaryFile() as output:
        pid = os.fork()
        if pid == 0:
            run_child(job, output.fileno())
        deadline = time.monotonic() + float(job["timeout"])  # type: ignore[arg-type]
        while True:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(wait_status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = "timeout"
                break
            time.sleep(0.01)
        output.seek(0)
        text = output.read().decode("utf-8", "replace")
    return {"status": status, "output": text}


def main() -> None:
    """Serve jobs from stdin until it closes."""
    for name in PRELOAD:
        __import__(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps(run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
