"""``tvp explain``: lookup by id or name, sections, did-you-mean, --list."""

from __future__ import annotations

import argparse

import pytest
from test_render_support import TEST_ERROR, TEST_NOTE, TEST_WARNING

import trainverify_dsl.report.codes as codes
from trainverify_dsl.cli import explain_cmd
from trainverify_dsl.report.diagnostics import Code, Severity

UNKNOWN_AXIS = Code("TVP997", "unknown-mesh-axis", Severity.ERROR,
                    "a statement names a mesh axis the mesh does not have",
                    "A layout refers to an axis not in `mesh`.",
                    "The statement would address a device group that does not exist.",
                    "plan demo\nmesh dp=2\nsplit tokens [dq, -]\n",
                    "plan demo\nmesh dp=2\nsplit tokens [dp, -]\n")
REGISTRY = (TEST_ERROR, TEST_WARNING, TEST_NOTE, UNKNOWN_AXIS)


@pytest.fixture
def explain(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(codes, "ALL_CODES", REGISTRY)

    def invoke(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser()
        explain_cmd.configure(parser)
        status = explain_cmd.run(parser.parse_args(list(argv)))
        out, err = capsys.readouterr()
        return status, out, err

    return invoke


def test_explain_by_id_any_case(explain) -> None:
    status, out, _ = explain("tvp997")
    assert status == 0
    assert out == (
        "TVP997 unknown-mesh-axis (error)\n\n"
        "a statement names a mesh axis the mesh does not have\n\n"
        "What it does\n    A layout refers to an axis not in `mesh`.\n\n"
        "Why is this bad\n"
        "    The statement would address a device group that does not exist.\n\n"
        "Example\n    plan demo\n    mesh dp=2\n    split tokens [dq, -]\n\n"
        "Use instead\n    plan demo\n    mesh dp=2\n    split tokens [dp, -]\n")


def test_explain_by_name_any_case(explain) -> None:
    assert explain("Unknown-Mesh-Axis")[1] == explain("TVP997")[1]


def test_unknown_code_suggests_close_matches(explain) -> None:
    status, out, err = explain("unknown-mesh-axes")
    assert (status, out) == (2, "")
    assert "unknown code 'unknown-mesh-axes'; did you mean TVP997 (unknown-mesh-axis)?" in err


def test_unknown_code_without_suggestion(explain) -> None:
    status, _, err = explain("completely-different")
    assert status == 2
    assert "did you mean" not in err
    assert "tvp explain --list" in err


def test_no_code_is_a_usage_error(explain) -> None:
    assert explain()[0] == 2


def test_list_prints_an_aligned_table(explain) -> None:
    status, out, _ = explain("--list")
    lines = out.splitlines()
    assert status == 0
    assert lines[0].split() == ["ID", "NAME", "SEVERITY", "SUMMARY"]
    assert [line.split()[0] for line in lines[1:]] == [c.id for c in REGISTRY]
    summary_column = lines[0].index("SUMMARY")
    for line, code in zip(lines[1:], REGISTRY, strict=True):
        assert line[summary_column:] == code.summary


def test_explain_wraps_long_prose() -> None:
    long = Code("TVP996", "long-text", Severity.WARNING, "s", "word " * 60, "why", "a", "b")
    what = explain_cmd.explain(long).split("What it does\n")[1].split("\n\n")[0]
    assert all(len(line) <= explain_cmd.WRAP for line in what.splitlines())
    assert len(what.splitlines()) > 1


def test_every_registered_code_explains() -> None:
    for code in codes.ALL_CODES:
        text = explain_cmd.explain(code)
        assert text.startswith(f"{code.id} {code.name} ({code.severity.value})")
        assert explain_cmd.find_code(code.name.upper(), codes.ALL_CODES) is code


def test_equally_close_codes_are_all_suggested_up_to_three(explain) -> None:
    err = explain("tvp99")[2]
    assert ("did you mean TVP990 (test-error) or TVP991 (test-warning) or TVP992 (test-note)?"
            in err)
