"""Shared pytest setup: the project root (for `stdlib.models`) is importable; a `float64`
fixture for tests that compare with torch numerically; FORCE_COLOR from the developer's shell
does not reach the commands under test (plain-text tests expect `--color auto` through a pipe
to be plain); every test has a proof cache of its own.

The process's trace memos (``spec/fx_key.py``: traced blocks, stage joints, decomposed
captures, reference outer joints) are shared by the tests of a worker, as by the checks of a
search loop: they are keyed exactly (a memo returns what a fresh trace makes, which
``tests/test_fx_key.py`` asserts after clearing them itself), and sharing them takes about a
tenth off the suite (1,002 s -> 914 s, `pytest -n 2`, one run each, 2026-12-07)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--bench", action="store_true",
                     help="also run the paper-size tests marked `bench` (minutes each)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``bench`` (full-mesh runs of paper-size plans, a minute or more each) are
    skipped, with the reason, unless ``--bench`` is given; the benchmarks in ``bench/`` run
    the same plans and record their numbers in ``bench/results/``."""
    if config.getoption("--bench"):
        return
    skip = pytest.mark.skip(reason="paper-size run: pytest --bench (numbers in bench/results/)")
    for item in items:
        if "bench" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def float64():
    """torch's default dtype float64 and a fixed seed for one test, restored afterwards.
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("float64")``."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture(autouse=True)
def _no_forced_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)


@pytest.fixture(autouse=True)
def _own_proof_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
                     ) -> None:
    """Each test has an empty proof cache of its own (``check/cache.py``), so a test that
    checks a plan proves it, whatever an earlier test or the developer's cache holds."""
    monkeypatch.setenv("TVP_CACHE_DIR", str(tmp_path_factory.mktemp("proofs")))
