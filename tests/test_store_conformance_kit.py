"""The shipped store conformance kit, run the way a user runs it: on their own file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

USER_FILE = '''
import pytest

from awaken_langchain import InMemoryStreamCheckpointStore
from awaken_langchain.testing.conformance import StoreConformanceTests


class ForgetfulStore(InMemoryStreamCheckpointStore):
    """Loses the retry count on the way back."""

    def get(self, run_id):
        got = super().get(run_id)
        return None if got is None else got.model_copy(update={"retry_count": 0})


class UnfencedStore(InMemoryStreamCheckpointStore):
    """Writes every put as the run's latest owner, whatever epoch it carries."""

    def claim(self, run_id):
        epoch = super().claim(run_id)
        self.__dict__.setdefault("latest", {})[run_id] = epoch
        return epoch

    def put(self, checkpoint):
        latest = self.__dict__.get("latest", {}).get(checkpoint.run_id, 0)
        super().put(checkpoint.model_copy(update={"epoch": latest}))


class InProcess(StoreConformanceTests):
    shares_data = False

    def reopen(self, stores, store, **settings):
        other = stores(**settings)
        for run_id in store.list_run_ids():
            other._backend_replace(*store._backend_load(run_id), 0)
        return other


class TestPlainStore(InProcess):
    @pytest.fixture
    def make_store(self):
        return InMemoryStreamCheckpointStore


class TestForgetfulStore(InProcess):
    @pytest.fixture
    def make_store(self):
        return ForgetfulStore


class TestUnfencedStore(InProcess):
    @pytest.fixture
    def make_store(self):
        return UnfencedStore
'''


def run_user_tests(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run pytest on the user's file alone, outside this project's configuration."""
    (tmp_path / "test_my_store.py").write_text(textwrap.dedent(USER_FILE))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "test_my_store.py", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_a_correct_user_store_passes_the_whole_kit(tmp_path: Path) -> None:
    done = run_user_tests(tmp_path, "-q", "-k", "TestPlainStore")
    assert done.returncode == 0, done.stdout + done.stderr
    assert " failed" not in done.stdout
    assert " passed" in done.stdout


@pytest.mark.slow
def test_a_store_that_loses_a_field_fails_the_kit_naming_the_field(tmp_path: Path) -> None:
    done = run_user_tests(tmp_path, "-q", "-k", "TestForgetfulStore and round_trips_every_field")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout
    assert "fields that did not round trip (written, read): {'retry_count': (2, 0)}" in (
        done.stdout
    )


@pytest.mark.slow
def test_a_store_that_ignores_fencing_fails_the_kit_readably(tmp_path: Path) -> None:
    done = run_user_tests(tmp_path, "-q", "-k", "TestUnfencedStore")
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "FAILED test_my_store.py::TestUnfencedStore::"
        "test_put_with_a_stale_epoch_is_fenced_and_changes_nothing"
    ) in done.stdout
    assert "DID NOT RAISE" in done.stdout
    assert "StreamCheckpointFencedError" in done.stdout


def test_the_package_imports_without_pytest() -> None:
    source = (
        "import sys\n"
        "sys.modules['pytest'] = None\n"  # any import of pytest now fails
        "import awaken_langchain, awaken_langchain.testing, awaken_langchain.stores\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", source],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "ok", done.stderr
