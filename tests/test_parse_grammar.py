"""The grammar file itself: LALR without conflicts, and in step with the AST builder; the
generated tables (``grammar/tvp.tables.json``) in step with the grammar.

    python tests/test_parse_grammar.py --update    # regenerate the tables after a grammar edit
"""

import json
import re
import sys
from collections import deque
from pathlib import Path

from lark import Lark
from lark.parsers.lalr_analysis import LALR_Analyzer, Shift

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(ROOT))

from trainverify_dsl.parse import grammar  # noqa: E402
from trainverify_dsl.parse.build import RULE_METHODS, AstBuilder  # noqa: E402
from trainverify_dsl.parse.grammar import GRAMMAR_FILE, _build, get_parser  # noqa: E402

GRAMMAR = GRAMMAR_FILE.read_text(encoding="utf-8")


def test_grammar_builds_under_lark_strict_mode():
    """strict=True: no shift/reduce conflicts and no colliding terminals (interegular)."""
    parser = _build(AstBuilder(), strict=True)
    assert parser.options.strict


def test_grammar_is_lalr_without_conflicts():
    """Lark's strict mode needs the optional ``interegular`` package for its regex check;
    the shift/reduce part of strict mode is run here directly."""
    analyzer = LALR_Analyzer(get_parser().parser.parser_conf, strict=True)
    analyzer.compute_lalr()
    assert analyzer.parse_table.states


def test_every_alias_has_a_builder_method_and_back():
    aliases = set(re.findall(r"->\s*([a-z_]+)", GRAMMAR))
    assert aliases == set(RULE_METHODS)


def test_every_alternative_of_a_kept_rule_has_an_alias():
    """Rules the builder sees (not `?`, not `_`) name every alternative with `-> alias`."""
    rules = re.findall(r"^([a-z]\w*)\s*:(.*?)(?=^\S|\Z)", GRAMMAR, re.M | re.S)
    assert rules
    for name, body in rules:
        alternatives = [a for a in re.split(r"\n\s*\|", body) if a.strip()]
        for alternative in alternatives:
            assert "->" in alternative, f"{name}: {alternative.strip()}"


def test_grammar_holds_no_python():
    assert "%python" not in GRAMMAR and "import" not in GRAMMAR.replace("%import", "")


def test_runtime_build_leaves_lark_collision_analysis_switched_on():
    """The run-time build skips Lark's collision analysis for itself only: the strict build
    above (and anyone else's Lark) still gets it."""
    import lark.lexer

    _build(AstBuilder(), strict=False)
    assert lark.lexer.has_interegular


# ---------------------------------------------------------------- generated tables


def canonical_tables(parser: Lark) -> tuple:
    """The parser's LALR tables with states numbered in breadth-first order from the start
    state (symbols sorted), and its terminals: equal for equal parsers, whatever numbering
    Lark's set iteration gave a build."""
    table = parser.parser.parser.parser.parse_table
    number = {table.start_states[start]: i for i, start in enumerate(sorted(table.start_states))}
    queue, rows = deque(number), []
    while queue:
        row = []
        for symbol, (action, arg) in sorted(table.states[queue.popleft()].items()):
            if action is Shift:
                if arg not in number:
                    number[arg] = len(number)
                    queue.append(arg)
                row.append((symbol, "shift", number[arg]))
            else:
                row.append((symbol, "reduce", str(arg), arg.alias, repr(arg.options)))
        rows.append(tuple(row))
    terminals = sorted((t.name, t.pattern.type, t.pattern.value, sorted(t.pattern.flags),
                        t.priority) for t in parser.terminals)
    ends = sorted((start, number[state]) for start, state in table.end_states.items())
    return tuple(rows), len(table.states), ends, terminals, sorted(parser.lexer_conf.ignore)


def test_the_shipped_tables_are_current():
    assert grammar.read_tables() is not None, (
        "grammar/tvp.tables.json does not match grammar/tvp.lark (or this Lark version): "
        "run python tests/test_parse_grammar.py --update")


def test_the_shipped_tables_load_into_the_tables_a_build_makes():
    loaded = grammar._load_tables(AstBuilder())
    assert loaded is not None
    built = grammar._lark(AstBuilder(), strict=False)
    assert canonical_tables(loaded) == canonical_tables(built)


def test_the_runtime_parser_comes_from_the_tables():
    assert get_parser().source_path == "<deserialized>"


def test_tables_of_another_grammar_or_lark_are_ignored(tmp_path: Path):
    tables = json.loads(grammar.TABLES_FILE.read_text(encoding="utf-8"))
    for key, value in (("grammar_sha256", "0" * 64), ("lark", "0.0.1")):
        stale = tmp_path / f"{key}.json"
        stale.write_text(json.dumps({**tables, "stamp": {**tables["stamp"], key: value}}))
        assert grammar.read_tables(stale) is None
    broken = tmp_path / "broken.json"
    broken.write_text(grammar.TABLES_FILE.read_text(encoding="utf-8")[:1000])
    assert grammar.read_tables(broken) is None
    assert grammar.read_tables(tmp_path / "missing.json") is None


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_parse_grammar.py --update")
    grammar.write_tables()
    print(f"wrote {grammar.TABLES_FILE}")
