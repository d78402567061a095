"""trainverify_dsl: a plan language and checker for distributed LLM training.

Pipeline (data flows one way):
    .tvp text -> parse (AST) -> plan (resolved Plan) -> lower (parallel IR) -> check -> report
    torch model -> spec (spec IR) ----------------------^
"""

from pathlib import Path

__version__ = "0.1.0"

#: Root of the source checkout: holds grammar/, stdlib/ and plans/.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
GRAMMAR_DIR = PROJECT_ROOT / "grammar"
STDLIB_DIR = PROJECT_ROOT / "stdlib"
