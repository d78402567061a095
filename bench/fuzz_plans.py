"""Fuzz `tvp lint`, `tvp fmt` (and optionally `tvp lint --spec`) with mutated shipped plans.

Plans come from pull requests and search tools: whatever they contain, the tools must answer
with diagnostics, never an internal error. Each input is a shipped plan (``plans/``,
``plans/bugs/``, ``stdlib/*.tvp``) changed by one to three mutations of the kinds real edits
make — a line deleted, duplicated, moved or re-indented, a word replaced by another word of
the language or of the plan, a number replaced by an edge value, a random statement inserted,
the file cut short — and is run through:

- **lint**: parse, resolve, semantic checks (``plan.lint_file``): it must not raise, and no
  diagnostic may be an internal error;
- **fmt**: when the input parses, its formatted text parses to the same plan (spans aside),
  formats to itself, and never loses a statement;
- **lint --spec** (``--spec``, slow: it lowers against the model): no exception.

``tests/test_fuzz_plans.py`` runs the same mutator under hypothesis on every test run; this
script is the long run, its last result recorded in ``bench/results/fuzz.md``:

    python bench/fuzz_plans.py --count 100000 --seed 1
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = (
    "plan spec mesh microbatches loss-scale loss-reduction use split replicate partial "
    "all-reduce all-gather "
    "reduce-scatter all-to-all copy scatter send pipeline-stage optimizer spec-optimizer "
    "clip-grad-norm on algorithm template apply for in over from to backward schedule shard grad "
    "params loss dp tp pp cp ep sp mp layers l x tokens labels op=sum op=avg op=max dim=0 dim=1 "
    "dim=2 dim=-1 split-dim=0 concat-dim=1 sgd adam adamw lr=0.1 lr=1e1000 momentum=0.9 "
    "betas=(0.9,0.95) eps=1e-8 weight-decay=0.1 identity gpipe 1f1b interleaved-1f1b "
    "row-parallel-linear vocab-parallel-embedding vocab-parallel-cross-entropy expert-parallel "
    "context-parallel-attention batch seq config - * [ ] ( ) , : . = + / # \" "
).split()
NUMBERS = ("0", "1", "-1", "2", "3", "7", "1e1000", "10**30", "2**62", "1.5", "1/0", "0.0",
           "-0", "1_000_000", "999999999999999999999")
TOKEN = re.compile(r"[A-Za-z_][\w.\-*]*|\d[\w.]*|\S")


def corpus() -> list[tuple[str, str]]:
    """``(name, text)`` of every shipped plan and template file."""
    files = sorted((ROOT / "plans").rglob("*.tvp")) + sorted((ROOT / "stdlib").glob("*.tvp"))
    return [(str(f.relative_to(ROOT)), f.read_text(encoding="utf-8")) for f in files]


def mutate(text: str, rng: random.Random) -> str:
    """One to three random edits of ``text``."""
    for _ in range(rng.randint(1, 3)):
        text = _one(text, rng)
    return text


def _one(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    kind = rng.randrange(9)
    if kind == 0 and len(lines) > 1:  # delete a line
        del lines[i]
    elif kind == 1:  # duplicate a line
        lines.insert(i, lines[i])
    elif kind == 2:  # move a line
        line = lines.pop(i)
        lines.insert(rng.randrange(len(lines) + 1), line)
    elif kind == 3:  # re-indent
        lines[i] = rng.choice(("", "    ", "        ", "\t", "  ")) + lines[i].lstrip()
    elif kind in (4, 5):  # replace a word by a language word or another word of the file
        words = TOKEN.findall(lines[i])
        if words:
            old = rng.choice(words)
            pool = WORDS if kind == 4 else TOKEN.findall(text) or WORDS
            lines[i] = lines[i].replace(old, rng.choice(pool), 1)
    elif kind == 6:  # a number becomes an edge value
        numbers = re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", lines[i])
        if numbers:
            lines[i] = lines[i].replace(rng.choice(numbers), rng.choice(NUMBERS), 1)
    elif kind == 7:  # a random statement
        size = rng.randint(1, 8)
        lines.insert(i, " ".join(rng.choice(WORDS) for _ in range(size)))
    else:  # the file cut short
        return text[:rng.randrange(len(text) + 1)]
    return "\n".join(lines)


class Failure(Exception):
    """A property did not hold: the input is kept for the report."""


def check_lint(path: Path) -> bool:
    """Whether the plan lints without errors."""
    from trainverify_dsl.plan import lint_file

    try:
        found = lint_file(path)
    except Exception as error:  # noqa: BLE001 - the property under test
        raise Failure(f"lint raised {type(error).__name__}: {error}") from None
    for d in found:
        if "internal error" in d.message.lower():
            raise Failure(f"lint reported an internal error: {d.message}")
    return not any(d.severity.name == "ERROR" for d in found)


def check_fmt(text: str) -> bool:
    """Whether the text parsed (and so was formatted)."""
    from trainverify_dsl.parse import format_source, parse_source
    from trainverify_dsl.parse.ast import strip_spans

    try:
        result = format_source(text, "fuzz.tvp")
    except Exception as error:  # noqa: BLE001 - the property under test
        raise Failure(f"fmt raised {type(error).__name__}: {error}") from None
    if result.text is None:
        return False
    again = parse_source(result.text, "fuzz.tvp")
    if any(d.severity.name == "ERROR" for d in again.diagnostics):
        raise Failure("fmt wrote text that does not parse: "
                      + "; ".join(d.message for d in again.diagnostics[:2]))
    before = strip_spans(parse_source(text, "fuzz.tvp").plan_file)
    if strip_spans(again.plan_file) != before:
        raise Failure("fmt changed the plan's meaning")
    if format_source(result.text, "fuzz.tvp").text != result.text:
        raise Failure("fmt is not idempotent")
    return True


def check_spec(path: Path) -> None:
    import warnings

    from trainverify_dsl.cli.lint_cmd import with_layout_pass
    from trainverify_dsl.plan import lint_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with_layout_pass(lint_file)(str(path))
        except Exception as error:  # noqa: BLE001 - the property under test
            raise Failure(f"lint --spec raised {type(error).__name__}: {error}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spec", type=int, default=0,
                        help="also run this many inputs through lint --spec (small plans)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    plans = corpus()
    small = [p for p in plans if "tiny" in p[0]]
    failures: list[tuple[str, str, str]] = []
    clean = formatted = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.tvp"
        for n in range(args.count + args.spec):
            name, text = rng.choice(small if n >= args.count else plans)
            mutated = mutate(text, rng)
            path.write_text(mutated, encoding="utf-8")
            try:
                if n >= args.count:
                    check_spec(path)
                else:
                    clean += check_lint(path)
                    formatted += check_fmt(mutated)
            except Failure as failure:
                failures.append((name, str(failure), mutated))
            if (n + 1) % 5000 == 0:
                print(f"{n + 1} inputs, {len(failures)} failures, "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
    elapsed = time.perf_counter() - start
    print(f"{args.count} inputs through lint and fmt, {args.spec} through lint --spec "
          f"(seed {args.seed}): {len(failures)} failures in {elapsed:.0f} s; "
          f"{formatted} parsed and were formatted, {clean} linted without errors")
    for name, why, mutated in failures[:20]:
        print(f"--- from {name}: {why}\n{mutated[:2000]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
