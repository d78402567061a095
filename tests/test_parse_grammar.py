"""The grammar file itself: LALR without conflicts, and in step with the AST builder."""

import re

from lark.parsers.lalr_analysis import LALR_Analyzer

from trainverify_dsl.parse.build import RULE_METHODS, AstBuilder
from trainverify_dsl.parse.grammar import GRAMMAR_FILE, _build, get_parser

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
