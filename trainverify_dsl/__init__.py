"""trainverify_dsl: a plan language and checker for distributed LLM training.

Pipeline (data flows one way):
    .tvp text -> parse (AST) -> plan (resolved Plan) -> lower (parallel IR) -> check -> report
    torch model -> spec (spec IR) ----------------------^
"""

from trainverify_dsl.resources import RESOURCES

__version__ = "0.1.0"

#: Root of relative ``use``/``spec`` paths: the checkout (holding grammar/, stdlib/, plans/),
#: or the package's bundled data folder when installed (``resources.py``).
PROJECT_ROOT = RESOURCES.project_root
GRAMMAR_DIR = RESOURCES.grammar_file.parent
STDLIB_DIR = RESOURCES.stdlib_dir
