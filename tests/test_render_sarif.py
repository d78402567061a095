"""SARIF 2.1.0: validated structurally against the properties the 2.1.0 schema defines.

No schema download: the allowed keys, required keys and enums of every object we emit are
written out below from the OASIS SARIF 2.1.0 schema, and every emitted object is checked
against them, together with the cross-references (ruleIndex -> rules, index -> artifacts).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_render_support import FILE, TEST_ERROR, TEST_NOTE, TEST_WARNING, error, warning

from trainverify_dsl import __version__
from trainverify_dsl.report.diagnostics import Diagnostic
from trainverify_dsl.report.render import LintReport
from trainverify_dsl.report.render.fingerprints import FINGERPRINT_KEY, LINE_HASH_KEY, line_hashes
from trainverify_dsl.report.render.sarif import artifact_location, region, render_sarif
from trainverify_dsl.report.span import Span

LEVELS = {"none", "note", "warning", "error"}
ALLOWED = {
    "log": {"$schema", "version", "runs", "inlineExternalProperties", "properties"},
    "run": {"tool", "invocations", "conversion", "language", "versionControlProvenance",
            "originalUriBaseIds", "artifacts", "logicalLocations", "graphs", "results",
            "automationDetails", "runAggregates", "baselineGuid", "redactionTokens",
            "defaultEncoding", "defaultSourceLanguage", "newlineSequences", "columnKind",
            "externalPropertyFileReferences", "threadFlowLocations", "taxonomies", "addresses",
            "translations", "policies", "webRequests", "webResponses", "specialLocations",
            "properties"},
    "driver": {"guid", "name", "organization", "product", "productSuite", "shortDescription",
               "fullDescription", "fullName", "version", "semanticVersion",
               "dottedQuadFileVersion", "releaseDateUtc", "downloadUri", "informationUri",
               "globalMessageStrings", "notifications", "rules", "taxa", "locations",
               "language", "contents", "isComprehensive", "localizedDataSemanticVersion",
               "minimumRequiredLocalizedDataSemanticVersion", "associatedComponent",
               "translationMetadata", "supportedTaxonomies", "properties"},
    "rule": {"id", "deprecatedIds", "guid", "deprecatedGuids", "name", "deprecatedNames",
             "shortDescription", "fullDescription", "messageStrings", "defaultConfiguration",
             "helpUri", "help", "relationships", "properties"},
    "configuration": {"enabled", "level", "rank", "parameters", "properties"},
    "multiformat": {"text", "markdown", "properties"},
    "message": {"text", "markdown", "id", "arguments", "properties"},
    "result": {"ruleId", "ruleIndex", "rule", "kind", "level", "message", "analysisTarget",
               "locations", "guid", "correlationGuid", "occurrenceCount",
               "partialFingerprints", "fingerprints", "stacks", "codeFlows", "graphs",
               "graphTraversals", "relatedLocations", "suppressions", "baselineState", "rank",
               "attachments", "hostedViewerUri", "workItemUris", "provenance", "fixes", "taxa",
               "webRequest", "webResponse", "properties"},
    "location": {"id", "physicalLocation", "logicalLocations", "message", "annotations",
                 "relationships", "properties"},
    "physical": {"address", "artifactLocation", "region", "contextRegion", "properties"},
    "artifactLocation": {"uri", "uriBaseId", "index", "description", "properties"},
    "region": {"startLine", "startColumn", "endLine", "endColumn", "charOffset", "charLength",
               "byteOffset", "byteLength", "snippet", "message", "sourceLanguage",
               "properties"},
    "invocation": {"commandLine", "arguments", "responseFiles", "startTimeUtc", "endTimeUtc",
                   "exitCode", "ruleConfigurationOverrides", "notificationConfigurationOverrides",
                   "toolExecutionNotifications", "toolConfigurationNotifications",
                   "exitCodeDescription", "exitSignalName", "exitSignalNumber",
                   "processStartFailureMessage", "executionSuccessful", "machine", "account",
                   "processId", "executableLocation", "workingDirectory",
                   "environmentVariables", "stdin", "stdout", "stderr", "stdoutStderr",
                   "properties"},
    "notification": {"locations", "message", "level", "threadId", "timeUtc", "exception",
                     "descriptor", "associatedRule", "properties"},
    "artifact": {"description", "location", "parentIndex", "offset", "length", "roles",
                 "mimeType", "contents", "encoding", "sourceLanguage", "hashes",
                 "lastModifiedTimeUtc", "properties"},
}


def check(kind: str, obj: Any, required: set[str] = frozenset()) -> None:
    assert isinstance(obj, dict), f"{kind} must be an object"
    assert set(obj) <= ALLOWED[kind], f"{kind} has unknown keys {set(obj) - ALLOWED[kind]}"
    assert required <= set(obj), f"{kind} lacks {required - set(obj)}"


def check_text(kind: str, obj: Any) -> None:
    check(kind, obj, {"text"})
    assert isinstance(obj["text"], str) and obj["text"]


def validate(log: dict[str, Any]) -> None:
    """Structural SARIF 2.1.0 checks for everything ``render_sarif`` emits."""
    check("log", log, {"version", "runs"})
    assert log["version"] == "2.1.0" and isinstance(log["$schema"], str)
    assert isinstance(log["runs"], list) and len(log["runs"]) == 1
    run = log["runs"][0]
    check("run", run, {"tool"})
    assert run["columnKind"] in {"utf16CodeUnits", "unicodeCodePoints"}
    driver = run["tool"]["driver"]
    check("driver", driver, {"name"})
    for rule in driver["rules"]:
        validate_rule(rule)
    ids = [rule["id"] for rule in driver["rules"]]
    assert len(ids) == len(set(ids)), "rule ids must be unique"
    for artifact in run["artifacts"]:
        check("artifact", artifact, {"location"})
        validate_artifact_location(artifact["location"], run["artifacts"])
    for result in run["results"]:
        validate_result(result, driver["rules"], run["artifacts"])
    for invocation in run.get("invocations", []):
        validate_invocation(invocation, run["artifacts"])


def validate_invocation(invocation: dict[str, Any], artifacts: list[Any]) -> None:
    check("invocation", invocation, {"executionSuccessful"})
    assert isinstance(invocation["executionSuccessful"], bool)
    for notification in invocation.get("toolExecutionNotifications", []):
        check("notification", notification, {"message"})
        check_text("message", notification["message"])
        assert notification["level"] in LEVELS
        for location in notification.get("locations", []):
            check("location", location)
            physical = location["physicalLocation"]
            check("physical", physical, {"artifactLocation"})
            validate_artifact_location(physical["artifactLocation"], artifacts)


def validate_rule(rule: dict[str, Any]) -> None:
    check("rule", rule, {"id"})
    assert isinstance(rule["id"], str) and isinstance(rule["name"], str)
    for key in ("shortDescription", "fullDescription", "help"):
        check_text("multiformat", rule[key])
    check("configuration", rule["defaultConfiguration"], {"level"})
    assert rule["defaultConfiguration"]["level"] in LEVELS


def validate_result(result: dict[str, Any], rules: list[Any], artifacts: list[Any]) -> None:
    check("result", result, {"message"})
    check_text("message", result["message"])
    assert result["level"] in LEVELS
    index = result["ruleIndex"]
    assert isinstance(index, int) and 0 <= index < len(rules)
    assert rules[index]["id"] == result["ruleId"]
    locations = result["locations"] + result.get("relatedLocations", [])
    for location in locations:
        check("location", location, {"physicalLocation"})
        physical = location["physicalLocation"]
        check("physical", physical, {"artifactLocation", "region"})
        validate_artifact_location(physical["artifactLocation"], artifacts)
        validate_region(physical["region"])
    prints = result.get("partialFingerprints", {})
    assert isinstance(prints, dict) and all(isinstance(v, str) for v in prints.values())
    related_ids = [loc["id"] for loc in result.get("relatedLocations", [])]
    assert all(isinstance(i, int) and i >= 0 for i in related_ids)
    assert len(related_ids) == len(set(related_ids))


def validate_artifact_location(location: dict[str, Any], artifacts: list[Any]) -> None:
    check("artifactLocation", location, {"uri"})
    uri = location["uri"]
    assert isinstance(uri, str) and "\\" not in uri and " " not in uri
    if "index" in location:
        assert artifacts[location["index"]]["location"]["uri"] == uri


def validate_region(value: dict[str, Any]) -> None:
    check("region", value, {"startLine"})
    assert all(isinstance(v, int) and v >= 1 for v in value.values())
    assert value["endLine"] >= value["startLine"]
    if value["endLine"] == value["startLine"]:
        assert value["endColumn"] >= value["startColumn"]


def sarif(diagnostics: list[Diagnostic], files: list[str], **options) -> dict[str, Any]:
    rules = options.pop("rules", [TEST_ERROR, TEST_WARNING, TEST_NOTE])
    return json.loads(render_sarif(LintReport.of(diagnostics, files), rules=rules, **options))


def test_full_log_is_structurally_valid() -> None:
    related = ((Span("other.tvp", 2, 1, 2, 5), "declared here"),)
    note = Diagnostic(TEST_NOTE, "fyi", Span(FILE, 1, 1, 1, 2))
    log = sarif([error(related=related, help="h", notes=("n",)), warning("w"), note],
                [FILE, "clean.tvp"])
    validate(log)
    run = log["runs"][0]
    assert run["tool"]["driver"]["name"] == "tvp"
    assert run["tool"]["driver"]["version"] == __version__
    assert [r["level"] for r in run["results"]] == ["warning", "note", "error"]
    assert [a["location"]["uri"] for a in run["artifacts"]] == [FILE, "clean.tvp", "other.tvp"]


def test_rules_come_from_the_registry_order_with_levels() -> None:
    run = sarif([], [])["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == ["TVP990", "TVP991", "TVP992"]
    assert [r["name"] for r in rules] == ["test-error", "test-warning", "test-note"]
    assert [r["defaultConfiguration"]["level"] for r in rules] == ["error", "warning", "note"]
    assert rules[0]["shortDescription"]["text"] == "a test error"
    assert "plan bad" in rules[0]["help"]["markdown"]


def test_default_rules_are_the_whole_registry_plus_unknown_codes() -> None:
    from trainverify_dsl.report.codes import ALL_CODES

    log = json.loads(render_sarif(LintReport.of([error()], [FILE])))
    validate(log)
    ids = [r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]]
    assert ids == [c.id for c in ALL_CODES] + ["TVP990"]
    assert log["runs"][0]["results"][0]["ruleIndex"] == len(ALL_CODES)


def test_result_location_and_message() -> None:
    (result,) = sarif([error(help="did you mean 'tp'?")], [FILE])["runs"][0]["results"]
    assert result["ruleId"] == "TVP990"
    assert result["message"]["text"] == "unknown mesh axis 'tq'\nhelp: did you mean 'tp'?"
    physical = result["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": FILE, "uriBaseId": "%SRCROOT%", "index": 0}
    assert physical["region"] == {"startLine": 3, "startColumn": 10, "endLine": 3,
                                  "endColumn": 12}


@pytest.mark.parametrize(("file", "root", "expected"), [
    ("plans/a.tvp", None, {"uri": "plans/a.tvp", "uriBaseId": "%SRCROOT%"}),
    ("./plans/a.tvp", None, {"uri": "plans/a.tvp", "uriBaseId": "%SRCROOT%"}),
    ("my plans/a b.tvp", None, {"uri": "my%20plans/a%20b.tvp", "uriBaseId": "%SRCROOT%"}),
    ("/repo/plans/a.tvp", "/repo", {"uri": "plans/a.tvp", "uriBaseId": "%SRCROOT%"}),
    ("/elsewhere/a.tvp", "/repo", {"uri": "file:///elsewhere/a.tvp"}),
    ("../up/a.tvp", "/repo", {"uri": "../up/a.tvp", "uriBaseId": "%SRCROOT%"}),
])
def test_artifact_uris(file: str, root: str | None, expected: dict[str, str]) -> None:
    from pathlib import PurePath

    assert artifact_location(file, PurePath(root) if root else None) == expected


def test_regions_never_end_before_they_start() -> None:
    assert region(Span(FILE, 2, 5, 2, 3)) == {"startLine": 2, "startColumn": 5, "endLine": 2,
                                              "endColumn": 5}
    assert region(Span(FILE, 2, 5, 4, 1)) == {"startLine": 2, "startColumn": 5, "endLine": 4,
                                              "endColumn": 1}


def test_validator_rejects_a_broken_rule_index() -> None:
    log = sarif([error()], [FILE])
    log["runs"][0]["results"][0]["ruleIndex"] = 1
    with pytest.raises(AssertionError):
        validate(log)


# ---------------------------------------------------------------- stable fingerprints


def _results(text: str, tmp_path) -> list[dict[str, Any]]:  # noqa: ANN001 - pytest's tmp_path
    """Lint ``text`` as ``plans/p.tvp`` (from ``tmp_path``) and return the validated SARIF
    log's results, in order."""
    import contextlib
    import io
    import os

    from trainverify_dsl.cli.main import main

    plan = tmp_path / "plans" / "p.tvp"
    plan.parent.mkdir(exist_ok=True)
    plan.write_text(text, encoding="utf-8")
    buffer = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(buffer):
            main(["lint", "--format", "sarif", "plans/p.tvp"])
    finally:
        os.chdir(cwd)
    log = json.loads(buffer.getvalue())
    validate(log)
    results = log["runs"][0]["results"]
    assert results, "the plan has findings"
    return results


def _fingerprints(text: str, tmp_path) -> list[dict[str, str]]:  # noqa: ANN001
    """Each result's ``partialFingerprints``, with its rule id."""
    return [{"rule": r["ruleId"], **r["partialFingerprints"]} for r in _results(text, tmp_path)]


PLAN = ("plan p\nmesh dp=2, tp=2\nreplicate w over dpp\nsplit v [tq, -]\n")


def test_every_result_has_both_fingerprints(tmp_path) -> None:  # noqa: ANN001
    for prints in _fingerprints(PLAN, tmp_path):
        assert set(prints) == {"rule", FINGERPRINT_KEY, LINE_HASH_KEY}


def test_fingerprints_are_stable_across_runs(tmp_path) -> None:  # noqa: ANN001
    assert _fingerprints(PLAN, tmp_path) == _fingerprints(PLAN, tmp_path)


def test_fingerprints_survive_lines_inserted_above(tmp_path) -> None:  # noqa: ANN001
    """GitHub matches alerts by fingerprint: a blank line or a comment above a finding moves
    it, but it stays the same alert; so does re-indenting its line."""
    before = _fingerprints(PLAN, tmp_path)
    moved = PLAN.replace("mesh dp=2, tp=2\n", "mesh dp=2, tp=2\n\n# a comment\n\n")
    assert _fingerprints(moved, tmp_path) == before
    assert _fingerprints("\n" + PLAN, tmp_path) == before
    reindented = PLAN.replace("replicate w over dpp", "replicate  w  over   dpp")
    assert _fingerprints(reindented, tmp_path) == before


def test_identical_lines_get_distinct_fingerprints_and_edits_change_them(
        tmp_path) -> None:  # noqa: ANN001
    twice = PLAN + "replicate w over dpp\n"
    prints = _fingerprints(twice, tmp_path)
    assert len(prints) == 4  # the duplicate statement is a finding too
    assert len({p[FINGERPRINT_KEY] for p in prints}) == 4
    assert len({(p["rule"], p[LINE_HASH_KEY]) for p in prints}) == 4  # GitHub adds the rule
    edited = PLAN.replace("split v [tq, -]", "split u [tq, -]")
    assert _fingerprints(edited, tmp_path)[1] != _fingerprints(PLAN, tmp_path)[1]


def test_lines_identical_down_to_the_end_are_told_apart_by_their_count(
        tmp_path) -> None:  # noqa: ANN001
    """Twelve equal lines at the end: the first ones' 100-character windows are equal too, so
    GitHub's hash is the same and only its ``:N`` count tells them apart."""
    repeated = "plan p\nmesh dp=2\n" + "split v [tq, -]\n" * 12
    prints = [p for p in _fingerprints(repeated, tmp_path) if p["rule"] == "TVP207"]
    assert len(prints) == 12
    hashes = [p[LINE_HASH_KEY] for p in prints]
    assert len(set(hashes)) == 12 and hashes[0].endswith(":1") and hashes[1].endswith(":2")
    assert hashes[0].split(":")[0] == hashes[1].split(":")[0]
    assert len({p[FINGERPRINT_KEY] for p in prints}) == 12


def test_the_line_hash_is_the_one_githubs_action_computes(tmp_path) -> None:  # noqa: ANN001
    """upload-sarif computes the hash of the result's line from the checked-out file and warns
    when the log holds another value; ours is the same (CRLF line endings included)."""
    for text in (PLAN, PLAN.replace("\n", "\r\n"), "# é 漢字 \U0001f600\n" + PLAN):
        expected = line_hashes(text)
        for result in _results(text, tmp_path):
            line = result["locations"][0]["physicalLocation"]["region"]["startLine"]
            assert result["partialFingerprints"][LINE_HASH_KEY] == expected[line - 1]


def test_a_file_that_is_not_a_plan_is_not_hashed(tmp_path) -> None:  # noqa: ANN001
    """TVP110 quotes nothing of the file (it may be a .env reached through `use`), and its
    fingerprints hash nothing of it either."""
    first = _fingerprints("API_TOKEN=first-secret\nPASSWORD=hunter2\n", tmp_path)
    second = _fingerprints("API_TOKEN=other-secret\nPASSWORD=swordfish\n", tmp_path)
    assert [p["rule"] for p in first] == ["TVP110"]
    assert first == second and LINE_HASH_KEY not in first[0]


# GitHub's own test vectors for the hash (codeql-action, src/fingerprints.test.ts): the text,
# then the hash of each line; `line_hashes` must give exactly these.
GITHUB_LINE_HASHES = [
    ("", ["c129715d7a2bc9a3:1"]),
    (" a\nb\n  \t\tc\n d",
     ["271789c17abda88f:1", "54703d4cd895b18:1", "180aee12dab6264:1", "a23a3dc5e078b07b:1"]),
    (" hello; \t\nworld!!!\n\n\n  \t\tGreetings\n End",
     ["8b7cf3e952e7aeb2:1", "b1ae1287ec4718d9:1", "bff680108adb0fcc:1", "c6805c5e1288b612:1",
      "b86d3392aea1be30:1", "e6ceba753e1a442:1"]),
    (" hello; \t\nworld!!!\r\n\n\r  \t\tGreetings\r End\r\n",
     ["e9496ae3ebfced30:1", "fb7c023a8b9ccb3f:1", "ce8ba1a563dcdaca:1", "e20e36e16fcb0cc8:1",
      "b3edc88f2938467e:1", "c8e28b0b4002a3a0:1", "c129715d7a2bc9a3:1"]),
    ("Lorem ipsum dolor sit amet.\n" * 10,
     [*(f"a7f2ff13bc495cf2:{n}" for n in range(1, 7)), "a7f2ff1481e87703:1",
      "a9cf91f7bbf1862b:1", "55ec222b86bcae53:1", "cc97dc7b1d7d8f7b:1", "c129715d7a2bc9a3:1"]),
    ("x = 2\nx = 1\nprint(x)\nx = 3\nprint(x)\nx = 4\nprint(x)\n",
     ["e54938cc54b302f1:1", "bb609acbe9138d60:1", "1131fd5871777f34:1", "5c482a0f8b35ea28:1",
      "54517377da7028d2:1", "2c644846cb18d53e:1", "f1b89f20de0d133:1", "c129715d7a2bc9a3:1"]),
]


@pytest.mark.parametrize(("text", "expected"), GITHUB_LINE_HASHES)
def test_line_hashes_are_githubs(text: str, expected: list[str]) -> None:
    assert line_hashes(text) == expected
