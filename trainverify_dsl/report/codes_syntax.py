"""Diagnostic codes of the syntax stage, TVP100-TVP199 (see report/codes.py for id ranges).

TVP100-TVP119 are found by the parser's own logic (characters, indentation, literals);
TVP120-TVP139 are recognised by example (``parse/errors.py`` matches a syntax error against
the bad snippets listed there; the first snippet of each is also the code's ``example``).
Every ``example`` produces its code and every ``fix`` parses clean (the tests check both),
except ``unreadable-file``, which is about the file, not its text.
"""

from trainverify_dsl.report.diagnostics import Code, Severity


def _error(id_: str, name: str, summary: str, what: str, why: str, example: str,
           fix: str) -> Code:
    return Code(id_, name, Severity.ERROR, summary, what, why, example, fix)


_WHY_STATEMENT = ("The statement cannot be understood, so it is skipped: every later pass "
                  "(names, layouts, the proof) runs without it.")

UNEXPECTED_CHARACTER = _error(
    "TVP100", "unexpected-character", "a character that no token of the language starts with",
    "A character such as `$`, `@` or `;` appears where the language has no token for it.",
    _WHY_STATEMENT,
    "split tokens [dp; -]\n",
    "split tokens [dp, -]\n")

UNEXPECTED_TOKEN = _error(
    "TVP101", "unexpected-token", "a word or symbol the statement does not allow here",
    "The statement is well formed up to this token, and the token cannot continue it.",
    _WHY_STATEMENT,
    "replicate params over dp pp\n",
    "replicate params over dp, pp\n")

UNEXPECTED_END_OF_LINE = _error(
    "TVP102", "unexpected-end-of-line", "the line ends before the statement is complete",
    "Every statement is one line; this one stops before its required parts.",
    _WHY_STATEMENT,
    "send x.out from 0\n",
    "send x.out from 0 to 1\n")

BAD_INDENTATION = _error(
    "TVP104", "bad-indentation", "indentation that no block opened",
    "A line is indented although no `for` or `template` opened a block, or it dedents to "
    "a column no enclosing block uses.",
    "Indentation decides which statements belong to a loop or template body; a stray "
    "indent would silently move a statement into or out of a loop.",
    "split tokens [dp, -]\n    split labels [dp, -]\n",
    "split tokens [dp, -]\nsplit labels [dp, -]\n")

EXPECTED_INDENTED_BLOCK = _error(
    "TVP105", "expected-indented-block", "a `for` or `template` header without a body",
    "A line ending in `:` opens a block; the next line must be indented further.",
    "An empty loop or template is almost always an indentation slip that moved the body "
    "out of it.",
    "for l in layers:\nsplit l.attention.wq.weight [tp, -]\n",
    "for l in layers:\n    split l.attention.wq.weight [tp, -]\n")

UNTERMINATED_STRING = _error(
    "TVP106", "unterminated-string", "a string without its closing quote",
    "A double-quoted string must end on the same line.",
    _WHY_STATEMENT,
    'use "stdlib/megatron.tvp\n',
    'use "stdlib/megatron.tvp"\n')

UNKNOWN_STATEMENT = _error(
    "TVP107", "unknown-statement", "a line that does not start with a statement keyword",
    "Each statement starts with a keyword: plan, spec, mesh, microbatches, loss-scale, "
    "loss-reduction, use, "
    "split, replicate, partial, place, a collective, send, pipeline-stage, optimizer, "
    "clip-grad-norm, on, algorithm, template, apply or for.",
    _WHY_STATEMENT,
    "allreduce grad(params) over dp\n",
    "all-reduce grad(params) over dp\n")

NESTING_TOO_DEEP = _error(
    "TVP108", "nesting-too-deep", "an expression or block nested more than 100 levels",
    "The parser refuses expressions, tuples and blocks nested more than 100 levels deep. "
    "Each operator of a chain is a level (`1+1+...+1` of 102 terms nests 101 sums), as is "
    "each parenthesis and each block.",
    "No real plan nests this deep; the limit keeps every later pass safe from running out "
    "of stack.",
    "loss-scale " + "-" * 300 + "1\n",
    "loss-scale 1\n")

UNREADABLE_FILE = _error(
    "TVP109", "unreadable-file", "the plan file cannot be read or is not UTF-8",
    "The file does not exist, is not a regular file (a directory, a FIFO, a device), cannot "
    "be opened, is binary (it holds a NUL byte), or contains bytes that are not UTF-8 "
    "(invalid bytes are replaced by U+FFFD and parsing continues).",
    "Nothing can be checked in a file that cannot be read.",
    "tvp lint missing.tvp\n",
    "plan fixed\n")

NOT_A_PLAN = Code(
    "TVP110", "not-a-plan", Severity.ERROR, "a file that does not look like a plan at all",
    "The file does not parse, and fewer than half of its lines start with a statement keyword "
    "(or a near miss of one, such as `allreduce`): it is some other file, such as `.env` "
    "secrets, a log or a data file, named on the command line, reached through a symlink or "
    "included with `use`. It gets this one diagnostic at 1:1 instead of one per line, and no "
    "renderer shows its text.",
    "A file that is not a plan cannot be checked; quoting it line by line would copy whatever "
    "it holds (passwords, tokens, megabytes of data) into terminals and CI logs.",
    "TOKEN=not-a-plan\nLOG_LEVEL=debug\n",
    "plan fixed\n",
    quotes_source=False)

BAD_PLACEMENT = _error(
    "TVP111", "bad-placement", "a `place` entry that is not S(dim), R or P(op)",
    "Placements are DTensor's: `S(d)`/`Shard(d)`, `R`/`Replicate()`, `P(op)`/`Partial(op)`.",
    _WHY_STATEMENT,
    "place x [S, R]\n",
    "place x [S(0), R]\n")

DUPLICATE_BACKWARD = _error(
    "TVP112", "duplicate-backward", "a collective that states its backward twice",
    "`backward KIND` may appear once per collective.",
    "Two backward meanings contradict each other; picking one silently could hide a bug.",
    "all-reduce x over tp backward identity backward all-reduce\n",
    "all-reduce x over tp backward identity\n")

NUMBER_OUT_OF_RANGE = _error(
    "TVP113", "number-out-of-range", "a number literal too large to evaluate",
    "Number literals may have at most 1000 digits and an exponent of at most 1000.",
    "Values are exact rationals; a literal like 1e999999999 would take forever to compute.",
    "loss-scale 1e999999999\n",
    "loss-scale 1e-3\n")

POSITIONAL_AFTER_KEYWORD = _error(
    "TVP114", "positional-after-keyword", "a positional template argument after a keyword one",
    "In `apply`, positional arguments come first, then `name=value` arguments.",
    "After a keyword argument the position of a positional one is ambiguous.",
    "apply column_parallel(m=l.attention.wq, tp)\n",
    "apply column_parallel(l.attention.wq, axis=tp)\n")

GLUED_NUMBER = _error(
    "TVP115", "glued-number", "a number with letters glued to it (`0x10`, `2k`, `1e`)",
    "Numbers are decimal: digits, an optional fraction and an optional exponent (`16`, `0.5`, "
    "`3e-4`), or an expression of them (`1/8`). A number followed at once by letters is read "
    "as the number and then a name, which the statement does not expect.",
    "The value meant (sixteen, two thousand) cannot be guessed from the text; reading only "
    "the leading digits would silently use another number.",
    "optimizer sgd lr=0x10\n",
    "optimizer sgd lr=16\n")

UNKNOWN_ESCAPE = _error(
    "TVP116", "unknown-escape", "a backslash in a string before anything but a quote or a "
    "backslash",
    "Strings take two escapes, `\\\"` (a quote) and `\\\\` (a backslash); any other "
    "backslash is an error at it. Paths use `/` on every system.",
    "A Windows path such as `plans\\new.tvp` would otherwise silently lose its backslash "
    "(`plansnew.tvp`), or read `\\n` as a letter: another file than the one meant.",
    'use "plans\\megatron.tvp"\n',
    'use "plans/megatron.tvp"\n')

# ---------------------------------------------------------------- recognised by example

EXPECTED_OVER = _error(
    "TVP120", "expected-over", "a collective or layout without `over AXES`",
    "Collectives and `partial` name the mesh axes of their group: `over tp` or `over dp, cp`.",
    "The group decides which ranks communicate; guessing it is how gradients end up "
    "averaged over the wrong ranks.",
    "all-reduce grad(params) dp\n",
    "all-reduce grad(params) over dp\n")

BAD_SPLIT_ENTRY = _error(
    "TVP121", "bad-split-entry", "a split entry that is not a mesh axis, `(a, b)` or `-`",
    "`split T [...]` takes one entry per tensor dimension: a mesh axis, several axes in "
    "parentheses, or `-` for a dimension that is not split.",
    _WHY_STATEMENT,
    "split tokens [dp, ]\n",
    "split tokens [dp, -]\n")

EXPECTED_SPLIT_DIMS = _error(
    "TVP122", "expected-split-dims", "`split` or `place` without its `[...]` list",
    "After the tensor comes a bracketed list with one entry per tensor dimension.",
    _WHY_STATEMENT,
    "split tokens dp\n",
    "split tokens [dp, -]\n")

BAD_MESH_AXIS = _error(
    "TVP123", "bad-mesh-axis", "a mesh axis not written as name=size",
    "`mesh` lists named axes with their sizes, outermost first: `mesh pp=4, dp=4, tp=8`.",
    _WHY_STATEMENT,
    "mesh dp 4\n",
    "mesh dp=4\n")

EXPECTED_COLON = _error(
    "TVP124", "expected-colon", "a missing `:` after a block header or stage number",
    "`for ... :`, `template ...(...):` and `pipeline-stage N:` end their header with `:`.",
    _WHY_STATEMENT,
    "for l in layers\n    split l.w [tp, -]\n",
    "for l in layers:\n    split l.w [tp, -]\n")

BAD_OPTION = _error(
    "TVP125", "bad-option", "an option not written as key=value",
    "Options follow the statement as `key=value` pairs: `op=avg`, `dim=0`, `lr=3e-4`.",
    _WHY_STATEMENT,
    "all-reduce grad(params) over dp op avg\n",
    "all-reduce grad(params) over dp op=avg\n")

EXPECTED_EXPRESSION = _error(
    "TVP126", "expected-expression", "a missing number, name or parenthesis in an expression",
    "Expressions combine numbers and names with + - * / and parentheses.",
    _WHY_STATEMENT,
    "loss-scale 1/\n",
    "loss-scale 1/microbatches\n")

UNCLOSED_BRACKET = _error(
    "TVP127", "unclosed-bracket", "a `[` list without its `]`",
    "A bracketed list must close on the same line.",
    _WHY_STATEMENT,
    "split tokens [dp, -\n",
    "split tokens [dp, -]\n")

UNCLOSED_PAREN = _error(
    "TVP128", "unclosed-paren", "a `(` without its `)`",
    "Parentheses must close on the same line.",
    _WHY_STATEMENT,
    "apply column_parallel(l.attention.wq, tp\n",
    "apply column_parallel(l.attention.wq, tp)\n")

EXPECTED_STRING = _error(
    "TVP129", "expected-string", "a path or model reference that is not quoted",
    "`use` and `spec` take a double-quoted string: `use \"stdlib/megatron.tvp\"`.",
    _WHY_STATEMENT,
    "use stdlib/megatron.tvp\n",
    'use "stdlib/megatron.tvp"\n')

EXPECTED_TARGET = _error(
    "TVP130", "expected-target", "a statement without the tensor it is about",
    "Layouts and collectives name a tensor: a module path (`layers.0.attention.wq.weight`), "
    "a glob (`layers.*.w1.weight`), an input, `loss`, `params` or `grad(X)`.",
    _WHY_STATEMENT,
    "split [dp, -]\n",
    "split tokens [dp, -]\n")

EXPECTED_BACKWARD_KIND = _error(
    "TVP131", "expected-backward-kind", "`backward` without what the backward is",
    "`backward` is followed by identity, all-reduce, all-gather, reduce-scatter, all-to-all "
    "or scatter.",
    _WHY_STATEMENT,
    "all-reduce x over tp backward\n",
    "all-reduce x over tp backward identity\n")

EXPECTED_NAME = _error(
    "TVP132", "expected-name", "a missing name after plan, template, apply or for",
    "`plan NAME`, `template NAME(...)`, `apply NAME(...)` and `for NAME in ...` need a name.",
    _WHY_STATEMENT,
    "plan\n",
    "plan llama3_8b\n")

CODES: tuple[Code, ...] = (
    UNEXPECTED_CHARACTER, UNEXPECTED_TOKEN, UNEXPECTED_END_OF_LINE, BAD_INDENTATION,
    EXPECTED_INDENTED_BLOCK, UNTERMINATED_STRING, UNKNOWN_STATEMENT, NESTING_TOO_DEEP,
    UNREADABLE_FILE, NOT_A_PLAN, BAD_PLACEMENT, DUPLICATE_BACKWARD, NUMBER_OUT_OF_RANGE,
    POSITIONAL_AFTER_KEYWORD, GLUED_NUMBER, UNKNOWN_ESCAPE,
    EXPECTED_OVER, BAD_SPLIT_ENTRY, EXPECTED_SPLIT_DIMS, BAD_MESH_AXIS, EXPECTED_COLON,
    BAD_OPTION, EXPECTED_EXPRESSION, UNCLOSED_BRACKET, UNCLOSED_PAREN, EXPECTED_STRING,
    EXPECTED_TARGET, EXPECTED_BACKWARD_KIND, EXPECTED_NAME,
)

#: Codes whose ``example`` is not plan text (they are about the file itself).
NOT_FROM_TEXT: frozenset[str] = frozenset({UNREADABLE_FILE.id})
