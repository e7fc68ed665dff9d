"""The notebooks in ``notebooks/`` run, offline, and show what they claim.

Each notebook is executed top to bottom in a fresh Jupyter kernel by nbclient.
The kernel is launched from this interpreter's ipykernel (``ipykernel``'s own
kernel spec, built in memory), so no kernel spec needs to be installed, and it
imports this checkout's ``awaken_langchain`` (``PYTHONPATH`` is the repo root).
Every notebook starts its own loopback provider; nothing leaves the machine.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import nbformat
import pytest
from ipykernel.kernelspec import RESOURCES, get_kernel_dict
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "notebooks"
CELL_TIMEOUT = 180
"""Seconds a cell may take; generous so a loaded CI machine does not fail the run."""

pytestmark = pytest.mark.slow


class _ThisInterpreterKernelSpecs(KernelSpecManager):
    """Resolves every kernel name to ipykernel running on this interpreter."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())


def execute(name: str) -> Any:
    """Run ``notebooks/<name>`` in a fresh kernel and return the executed notebook.

    A cell that raises fails the test with the cell's traceback
    (``nbclient.exceptions.CellExecutionError``).
    """
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    kernel_manager = AsyncKernelManager(
        kernel_name="python3", kernel_spec_manager=_ThisInterpreterKernelSpecs()
    )
    client = NotebookClient(
        notebook,
        km=kernel_manager,
        timeout=CELL_TIMEOUT,
        startup_timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(REPO_ROOT)}},
    )
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    client.execute(env={**os.environ, "PYTHONPATH": pythonpath, "MPLBACKEND": "Agg"})
    return notebook


def text_output(notebook: Any) -> str:
    """Everything the code cells printed or displayed as text, in order.

    A kernel may deliver one ``print`` as several stream outputs when it
    flushes between the pieces (it does on a loaded machine), so consecutive
    pieces of one stream are joined as written, with nothing in between.
    """
    parts: list[str] = []
    for cell in notebook.cells:
        stream: str | None = None
        for output in cell.get("outputs", []):
            if output.output_type == "stream" and output.name == stream:
                parts[-1] += output.text
                continue
            stream = output.name if output.output_type == "stream" else None
            if output.output_type == "stream":
                parts.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                parts.append(output.data.get("text/plain", ""))
    return "\n".join(parts)


def images(notebook: Any) -> list[bytes]:
    """The PNG images the notebook displayed."""
    return [
        base64.b64decode(output.data["image/png"])
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.output_type in ("execute_result", "display_data") and "image/png" in output.data
    ]


def test_quickstart_recovers_a_rate_limit_and_a_dropped_connection_in_a_chain() -> None:
    notebook = execute("01_quickstart.ipynb")
    out = text_output(notebook)
    assert (
        "request 3: continuation responder messages: ['system', 'user', 'assistant', 'user']" in out
    )
    assert "'plans': ['R4', 'R1']" in out
    assert "awaken_retry         plan=R4 cause=rate_limited" in out
    assert "awaken_continuation  plan=R1 cause=connection" in out


def test_crash_notebook_resumes_the_killed_run_and_plots_measured_runs() -> None:
    notebook = execute("02_crash_and_resume.ipynb")
    out = text_output(notebook)
    assert "child exit code:       -9" in out
    assert "whole answer delivered:       True" in out
    assert "'resumed': True, 'attempts': 1, 'plans': ['R1']" in out
    assert "no recovery            lost: OpenAIConnectionError" in out
    [png] = images(notebook)
    assert png.startswith(b"\x89PNG")
    assert len(png) < 100_000


def test_agent_notebook_never_runs_a_cut_off_tool_call() -> None:
    notebook = execute("03_agents.ipynb")
    out = text_output(notebook)
    truncated = "tool calls executed: [{'to': 'alice', 'amount': 100, 'confirm': False}]"
    complete = "tool calls executed: [{'to': 'alice', 'amount': 100, 'confirm': True}]"
    assert out.count(truncated) == 1  # the bare model: the truncated call ran
    assert out.count(complete) == 2  # the wrapper: one complete call, after each cut
    assert "invalid tool calls: []" in out
    assert """streamed tool arguments: ['{"to":"alice","amount":100,"confirm":true}']""" in out


def test_agent_middleware_notebook_finishes_the_turn_on_the_fallback_model() -> None:
    notebook = execute("04_agent_middleware.ipynb")
    out = text_output(notebook)
    assert (
        "awaken_fallback      plan=R1 cause=overloaded "
        "openai-chat:gpt-4o-mini -> anthropic-chat:claude-loopback"
    ) in out
    assert "openai-chat:gpt-4o-mini          [0:32] 'It is sunny in Paris today, abou'" in out
    assert "anthropic-chat:claude-loopback   [32:132] 't twenty-two degrees" in out
    assert "final answer: It is sunny in Paris today, about twenty-two degrees" in out
    assert "thread: ['HumanMessage', 'AIMessage', 'ToolMessage', 'AIMessage']" in out
    assert out.count("tool executed: ['Paris']") == 1
    # with fallbacks the UI got every word once; ModelFallbackMiddleware restarts the call
    assert out.count("streamed to the UI once: True") == 1
    assert out.count("streamed to the UI once: False") == 1
    assert "final answer is whole:   True" in out


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_committed_notebooks_carry_no_outputs(path: Path) -> None:
    notebook = json.loads(path.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{path.name}: strip the outputs before committing"
            assert cell["execution_count"] is None


def test_tool_ledger_notebook_pays_once_across_two_kills() -> None:
    notebook = execute("05_tool_ledger.ipynb")
    out = text_output(notebook)
    assert out.count("worker exit code: -9") == 2
    assert out.count("payments after the crash: 1") == 2
    assert out.count("payments after the replacement: 1") == 2
    assert "tool message status: error" in out
    assert "outcome of this call is unknown" in out
    assert "tool message: paid 5 (success)" in out
    assert "['awaken_tool_ledger_replay'] -> tool result replayed from the ledger" in out
    assert "final answer: Paid 5 euros to Ana." in out
