"""The bug corpus (plans/bugs/): at least 24 plans, each naming the real-world pattern it
reproduces (`# pattern: ...`), all listed in the README tables.

The rest is tested beside the other plans: the faulty line and the distance to the correct
twin in tests/test_plans.py; every bug differing or rejected at its line in
tests/test_simulate_plans.py, tests/test_check.py and tests/test_oracle_distributed.py, and
every twin agreeing, verified or agreeing with torch there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUGS = sorted((ROOT / "plans" / "bugs").glob("*.tvp"))


def header(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    end = next(k for k, line in enumerate(lines) if line.startswith("plan "))
    return lines[:end]


def test_the_corpus_covers_at_least_24_bugs() -> None:
    assert len(BUGS) >= 24


@pytest.mark.parametrize("path", BUGS, ids=lambda p: p.stem)
def test_the_header_names_the_pattern_it_reproduces(path: Path) -> None:
    found = [line for line in header(path) if line.startswith("# pattern: ")]
    assert len(found) == 1, path.name
    assert len(found[0]) > len("# pattern: ") + 20


def test_the_readme_tables_list_every_bug() -> None:
    readme = (ROOT / "README.md").read_text()
    plans_readme = (ROOT / "plans" / "README.md").read_text()
    for path in BUGS:
        assert f"| `{path.stem}` |" in readme, path.stem
        assert f"| `{path.name}` |" in plans_readme, path.name
    assert f"holds {len(BUGS)} plans" in readme
