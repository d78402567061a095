"""A soundness fuzz of `tvp check`: semantic one-statement mutations of small correct plans.

`bench/fuzz_plans.py` mutates plans syntactically and asks that the tools never crash. This
script asks the sharper question: when a correct plan is changed by one of the edits an
engineer gets wrong (a collective swapped, the wrong group, `op=avg` for `op=sum`, a missing
statement, a split on the wrong dimension, a backward stated wrongly, the loss scale, an
optimizer hyper-parameter, a pipeline stage's membership, a gradient statement's timing, a
template replaced by another one), do `tvp lint --spec`, `tvp simulate` and `tvp check` agree?
A few mutations are *correct* rewrites (a mesh axis renamed consistently, the mesh axes'
order swapped, a loop variable renamed, a template parameter renamed): they must stay
`verified`.

Each mutant is the plan (and, when the plan uses `stdlib/megatron.tvp` and the mutation is in
a template, a copy of that file beside it with the plan's `use` line rewritten to it) in its
own folder under `/tmp/check_fuzz/mutants/`; the `spec` line names the shipped model
(`stdlib/models/...`), which resolves from any folder. Every mutant runs in a fresh Python
process (`--worker`), which runs, through the CLI's own entry point (`cli.main.main`) with its
stdout captured:

    tvp lint --spec --format json M            (time limit 180 s)
    tvp simulate --format json M               (time limit 180 s)
    tvp check --format json --time-limit 120 --no-cache M   (time limit 300 s)

and the parent kills a worker after 720 s. Each mutant is classified:

    a  rejected: lint --spec reports an error (or simulate and check both refuse the plan)
       and check does not say verified                                        -- fine
    b  simulate differs, check counterexample at the mutated line              -- fine
    c  simulate agrees, check verified (an equivalent mutation)                -- fine
    d  SOUNDNESS BUG: check verified while simulate differs or lint --spec
       reports an error                                                        -- finding
    e  false alarm: check counterexample (or error) while lint is clean and
       simulate agrees; the gloo oracle (`tvp run-distributed`) is run on it   -- finding
    f  crash: a traceback, an internal error, exit 2 with an internal error    -- finding
    g  inconclusive: check inconclusive, a time limit, or outcomes that do not
       fit the classes above (the reason is recorded)
    h  check counterexample at another line than the mutated one (simulate
       differs too); a deletion has no mutated line and is never h             -- finding

Findings (d, e, f, h) are written to `/tmp/check_fuzz/findings/<id>-<class>/` with the exact
plan text (and template copy), the original, a diff and every command's output; d, e and f
are confirmed by running the three commands again as separate `tvp` processes, and d and e
also by the gloo oracle.

    python bench/check_fuzz.py --count 10 --seed 1
    python bench/check_fuzz.py --count 1000 --seed 1 --budget 4200    # stop after 70 min
    python bench/check_fuzz.py --count 20 --seed 3 --plans llama_tiny_tp mlp_tiny_dp
    python bench/check_fuzz.py --report /tmp/check_fuzz/run-seed1.jsonl --count 1000 --seed 1
    python bench/check_fuzz.py --recheck /tmp/check_fuzz/findings/*

`--report` classifies a run's log (`/tmp/check_fuzz/run-seedS.jsonl`) again with this
script's rules; `--recheck` runs the findings again (the code under test may have changed
since). Each run's log row names the commit and the time it ran at. The result of a long
run is recorded by hand in `bench/results/check_fuzz.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = Path("/tmp/check_fuzz")
MEGATRON = ROOT / "stdlib" / "megatron.tvp"
USE_MEGATRON = 'use "stdlib/megatron.tvp"'
TEMPLATE_COPY = "megatron.tvp"

PLANS = ("mlp_tiny_dp", "mlp_dp_tp", "mlp_tiny_zero", "mlp_tiny_overlap",
         "mlp_tp_gather_output", "llama_tiny_tp", "llama_tiny_sp", "llama_tiny_cp",
         "llama_tiny_clip", "llama_tiny_masked", "llama_tiny_tied", "llama_tiny_interleaved")

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "copy", "scatter")
BACKWARDS = ("identity", "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "scatter")
DEFAULT_BACKWARD = {"all-reduce": "identity", "all-gather": "reduce-scatter",
                    "reduce-scatter": "all-gather", "all-to-all": "all-to-all",
                    "copy": "all-reduce", "scatter": "all-gather"}

#: per-command time limits inside the worker (seconds) and the worker's own hard limit
LIMITS = {"lint": 180, "simulate": 180, "check": 300}
CHECK_TIME_LIMIT = 120
WORKER_LIMIT = 720
ORACLE_TIMEOUT = 180

CLASSES = {
    "a": "rejected by lint --spec / refused by simulate and check",
    "b": "simulate differs, check counterexample at the mutated line",
    "c": "simulate agrees, check verified (equivalent mutation)",
    "d": "SOUNDNESS BUG: check verified, simulate differs or lint errors",
    "e": "false alarm: check rejects, lint clean and simulate agrees",
    "f": "crash / internal error",
    "g": "inconclusive or unclassified",
    "h": "check counterexample at another line (mis-location)",
}
FINDING_CLASSES = ("d", "e", "f", "h")


# ---------------------------------------------------------------- mutants


@dataclass
class Mutant:
    plan: str
    kind: str
    #: "plan" or "template" (the copy of stdlib/megatron.tvp)
    where: str
    description: str
    #: the mutated file's new text and the plan text (the plan text is rewritten to use the
    #: template copy when ``where == "template"``)
    plan_text: str
    template_text: str | None
    #: lines (1-based) of the mutated file that carry the mutation; empty for a deletion
    mutated_lines: list[int]
    old: str
    new: str
    #: True when the mutation is a correct rewrite (it must stay verified)
    equivalent: bool = False


def _code(line: str) -> str:
    """The line without its comment (no `#` occurs inside the strings of these plans)."""
    return line.split("#", 1)[0].rstrip()


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def _split_top(text: str) -> list[str]:
    """Comma-separated items of ``text`` at bracket depth 0."""
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        items.append(cur.strip())
    return items


COLLECTIVE_RE = re.compile(r"^(\s*)(all-reduce|all-gather|reduce-scatter|all-to-all|copy|scatter)"
                           r"\s+(\S+)\s+over\s+(.*)$")


@dataclass
class Collective:
    indent: str
    kind: str
    target: str
    axes: list[str]
    #: options in order: ("dim", "1"), ("op", "avg"), ("backward", "scatter"), ...
    options: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, line: str) -> Collective | None:
        m = COLLECTIVE_RE.match(_code(line))
        if m is None:
            return None
        indent, kind, target, rest = m.groups()
        rest = rest.strip()
        axes: list[str] = []
        if rest.startswith("("):
            close = rest.index(")")
            axes = [a.strip() for a in rest[1:close].split(",")]
            rest = rest[close + 1:].strip()
            tokens = rest.split()
        else:
            tokens = rest.split()
            while tokens:
                tok = tokens.pop(0)
                axes.append(tok.rstrip(","))
                if not tok.endswith(","):
                    break
        options: list[tuple[str, str]] = []
        while tokens:
            tok = tokens.pop(0)
            if tok == "backward" and tokens:
                options.append(("backward", tokens.pop(0)))
            elif "=" in tok:
                key, value = tok.split("=", 1)
                options.append((key, value))
            else:
                return None
        return cls(indent, kind, target, axes, options)

    def option(self, key: str) -> str | None:
        return next((v for k, v in self.options if k == key), None)

    def with_option(self, key: str, value: str | None) -> Collective:
        options = [(k, v) for k, v in self.options if k != key]
        if value is not None:
            options.append((key, value))
        return Collective(self.indent, self.kind, self.target, list(self.axes), options)

    def render(self) -> str:
        opts = " ".join(f"backward {v}" if k == "backward" else f"{k}={v}"
                        for k, v in self.options)
        return f"{self.indent}{self.kind} {self.target} over {', '.join(self.axes)}" + \
            (f" {opts}" if opts else "")

    @property
    def on_gradient(self) -> bool:
        return self.target.startswith("grad(")


def mesh_axes(text: str) -> list[str]:
    for line in text.splitlines():
        m = re.match(r"^mesh\s+(.*)$", _code(line))
        if m:
            return [part.split("=")[0].strip() for part in m.group(1).split(",")]
    return []


def templates(text: str) -> dict[str, tuple[list[str], int, int, int]]:
    """name -> (parameter names, required count, first line, last line) (1-based, inclusive)."""
    lines = text.splitlines()
    found = {}
    for i, line in enumerate(lines):
        m = re.match(r"^template\s+(\w+)\((.*)\):", line)
        if not m:
            continue
        params = _split_top(m.group(2))
        names = [p.split("=")[0].strip() for p in params]
        required = sum(1 for p in params if "=" not in p)
        end = i
        for j in range(i + 1, len(lines)):
            if lines[j].strip() and not lines[j].startswith((" ", "\t")):
                break
            if lines[j].strip():
                end = j
        found[m.group(1)] = (names, required, i + 1, end + 1)
    return found


APPLY_RE = re.compile(r"^(\s*)apply\s+(\w+)\((.*)\)\s*$")


def used_templates(plan_text: str, library: dict[str, tuple[list[str], int, int, int]],
                   library_text: str) -> list[str]:
    """The templates the plan applies, transitively."""
    lib_lines = library_text.splitlines()
    todo = [m.group(2) for line in plan_text.splitlines()
            if (m := APPLY_RE.match(_code(line)))]
    seen: list[str] = []
    while todo:
        name = todo.pop()
        if name in seen or name not in library:
            continue
        seen.append(name)
        _, _, first, last = library[name]
        for line in lib_lines[first:last]:
            m = APPLY_RE.match(_code(line))
            if m:
                todo.append(m.group(2))
    return seen


#: a candidate edit of one file: (kind, description, new lines, mutated lines, old, new, equiv)
Edit = tuple[str, str, list[str], list[int], str, str, bool]


def _replace(lines: list[str], i: int, new: str, kind: str, equivalent: bool = False) -> Edit:
    out = list(lines)
    out[i] = new
    return (kind, f"L{i + 1}: {lines[i].strip()!r} -> {new.strip()!r}", out, [i + 1],
            lines[i].strip(), new.strip(), equivalent)


def _dims_for(c: Collective) -> list[str]:
    have = c.option("dim") or c.option("split-dim")
    dims = ["0", "1", "-1"]
    return [have] + [d for d in dims if d != have] if have else dims


def collective_edits(lines: list[str], axes: list[str], in_template: bool) -> list[Edit]:
    """Kind swaps, groups, ops, backward clauses, dims, timing, duplicates."""
    edits: list[Edit] = []
    axis_words = axes + (["axis"] if in_template else [])
    for i, line in enumerate(lines):
        c = Collective.parse(line)
        if c is None:
            continue
        # kind swapped (options adapted so the statement stays well-formed where possible)
        for kind in COLLECTIVES:
            if kind == c.kind:
                continue
            keep = [(k, v) for k, v in c.options if k in ("backward", "after")]
            op = c.option("op")
            variants: list[list[tuple[str, str]]] = []
            if kind == "all-reduce":
                variants = [keep + ([("op", op)] if op else [])]
            elif kind in ("all-gather", "scatter"):
                variants = [keep + [("dim", d)] for d in _dims_for(c)[:2]]
            elif kind == "reduce-scatter":
                variants = [keep + [("dim", d)] + ([("op", op)] if op else [])
                            for d in _dims_for(c)[:2]]
            elif kind == "all-to-all":
                variants = [keep + [("split-dim", "1"), ("concat-dim", "0")],
                            keep + [("split-dim", "0"), ("concat-dim", "1")]]
            elif kind == "copy":
                variants = [keep]
            for options in variants:
                new = Collective(c.indent, kind, c.target, list(c.axes), options)
                edits.append(_replace(lines, i, new.render(), "collective-kind"))
        # the group: another axis, two axes, the axes reordered
        for k in range(len(c.axes)):
            for other in axis_words:
                if other in c.axes:
                    continue
                new_axes = list(c.axes)
                new_axes[k] = other
                edits.append(_replace(lines, i, Collective(c.indent, c.kind, c.target, new_axes,
                                                           c.options).render(), "over-axis"))
        for other in axis_words:
            if other not in c.axes:
                edits.append(_replace(lines, i, Collective(c.indent, c.kind, c.target,
                                                           c.axes + [other],
                                                           c.options).render(), "over-axis"))
        if len(c.axes) > 1:
            edits.append(_replace(lines, i, Collective(c.indent, c.kind, c.target,
                                                       list(reversed(c.axes)),
                                                       c.options).render(), "over-axis"))
            edits.append(_replace(lines, i, Collective(c.indent, c.kind, c.target, c.axes[:1],
                                                       c.options).render(), "over-axis"))
        # op
        if c.kind in ("all-reduce", "reduce-scatter"):
            op = c.option("op")
            for new_op in ("sum", "avg", "max", None):
                if new_op == op:
                    continue
                edits.append(_replace(lines, i, c.with_option("op", new_op).render(), "op"))
        # backward clause: added, changed, removed
        if not c.on_gradient or in_template:
            stated = c.option("backward")
            for b in BACKWARDS:
                if b != (stated or DEFAULT_BACKWARD[c.kind]):
                    edits.append(_replace(lines, i, c.with_option("backward", b).render(),
                                          "backward"))
            if stated is not None:
                edits.append(_replace(lines, i, c.with_option("backward", None).render(),
                                      "backward"))
            if stated is None:  # the default stated explicitly: a correct rewrite
                edits.append(_replace(lines, i, c.with_option(
                    "backward", DEFAULT_BACKWARD[c.kind]).render(), "backward-explicit",
                    equivalent=True))
        # dims
        for key in ("dim", "split-dim", "concat-dim"):
            value = c.option(key)
            if value is None:
                continue
            for d in ("0", "1", "2", "-1"):
                if d != value:
                    edits.append(_replace(lines, i, c.with_option(key, d).render(), "dim"))
        # timing of gradient statements
        if c.on_gradient:
            after = c.option("after")
            for a in ("each", "last", "0", "1"):
                if a != after:
                    edits.append(_replace(lines, i, c.with_option("after", a).render(),
                                          "after"))
            if after is not None:
                edits.append(_replace(lines, i, c.with_option("after", None).render(), "after"))
        # an extra duplicated collective
        out = list(lines)
        out.insert(i + 1, line)
        edits.append(("duplicate", f"L{i + 1} duplicated: {line.strip()!r}", out,
                      [i + 1, i + 2], line.strip(), f"{line.strip()} (twice)", False))
    return edits


SPLIT_RE = re.compile(r"^(\s*)split\s+(\S+)\s+\[(.*)\]\s*$")


def split_edits(lines: list[str], axes: list[str], in_template: bool) -> list[Edit]:
    edits: list[Edit] = []
    axis_words = axes + (["axis"] if in_template else [])
    for i, line in enumerate(lines):
        m = SPLIT_RE.match(_code(line))
        if m is None:
            continue
        indent, target, body = m.groups()
        entries = _split_top(body)

        def render(es: list[str], indent: str = indent, target: str = target) -> str:
            return f"{indent}split {target} [{', '.join(es)}]"

        seen = {render(entries)}

        def add(es: list[str], kind: str = "split", seen: set[str] = seen, i: int = i) -> None:
            text = render(es)
            if text not in seen:
                seen.add(text)
                edits.append(_replace(lines, i, text, kind))

        for a, b in itertools.combinations(range(len(entries)), 2):  # dims permuted
            es = list(entries)
            es[a], es[b] = es[b], es[a]
            add(es)
        for a, entry in enumerate(entries):
            if entry == "-":
                continue
            for b in range(len(entries)):  # an axis moved to another dimension
                if b != a and entries[b] == "-":
                    es = list(entries)
                    es[a], es[b] = "-", entry
                    add(es)
            add(entries[:a] + ["-"] + entries[a + 1:])  # axis dropped
            if entry.startswith("(") and entry.endswith(")"):  # block order
                inner = [x.strip() for x in entry[1:-1].split(",")]
                add(entries[:a] + ["(" + ", ".join(reversed(inner)) + ")"] + entries[a + 1:])
                add(entries[:a] + [inner[0]] + entries[a + 1:])
            elif re.fullmatch(r"\w+", entry):
                for other in axis_words:  # another axis
                    if other != entry and other not in body:
                        add(entries[:a] + [other] + entries[a + 1:])
                if entry == "cp":
                    add(entries[:a] + ["zigzag(cp)"] + entries[a + 1:])
        for a, entry in enumerate(entries):  # an axis added on an unsplit dimension
            if entry == "-":
                for other in axis_words:
                    if other not in body:
                        add(entries[:a] + [other] + entries[a + 1:])
    return edits


def delete_edits(lines: list[str]) -> list[Edit]:
    edits: list[Edit] = []
    for i, line in enumerate(lines):
        code = _code(line).strip()
        if not code or code.startswith(("plan ", "template ")):
            continue
        out = list(lines)
        del out[i]
        edits.append(("delete", f"L{i + 1} deleted: {line.strip()!r}", out, [],
                      line.strip(), "(deleted)", False))
    return edits


def _number_variants(value: str) -> list[str]:
    from fractions import Fraction

    try:
        x = Fraction(value)
    except (ValueError, ZeroDivisionError):
        return []
    out = [x * 10, x / 2, x * Fraction(1000001, 1000000), Fraction(0)]
    return [_fmt(v) for v in out if v != x]


def _fmt(x) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    f = float(x)
    return repr(f) if float(repr(f)) == f else f"{x.numerator}/{x.denominator}"


OPT_RE = re.compile(r"^(\s*)((?:on [^:]+:\s*)?)(optimizer|spec-optimizer)\s+(\w+)(.*)$")


def optimizer_edits(lines: list[str], axes: list[str]) -> list[Edit]:
    edits: list[Edit] = []
    plan_opt = None
    for i, line in enumerate(lines):
        m = OPT_RE.match(_code(line))
        if m is None:
            continue
        indent, on, head, kind, rest = m.groups()
        if head == "optimizer" and not on:
            plan_opt = (i, kind, rest)
        # hyper-parameters changed
        for hm in re.finditer(r"(lr|eps|weight-decay|momentum|clip-grad-norm)=([0-9.e\-/]+)",
                              rest):
            for v in _number_variants(hm.group(2)):
                new_rest = rest[:hm.start(2)] + v + rest[hm.end(2):]
                edits.append(_replace(lines, i, f"{indent}{on}{head} {kind}{new_rest}",
                                      "optimizer-hyper"))
        bm = re.search(r"betas=\(([^)]*)\)", rest)
        if bm:
            b1, b2 = [x.strip() for x in bm.group(1).split(",")]
            for nb in (f"({b2}, {b1})", "(0.9, 0.999)", f"({b1}, 0.9)"):
                if nb != f"({b1}, {b2})":
                    new_rest = rest[:bm.start()] + f"betas={nb}" + rest[bm.end():]
                    edits.append(_replace(lines, i, f"{indent}{on}{head} {kind}{new_rest}",
                                          "optimizer-hyper"))
        base = re.sub(r"\s+shard over .*$", "", rest)
        if kind == "sgd":
            for extra in (" momentum=0.9", " weight-decay=0.1"):
                if extra.split("=")[0].strip() not in rest:
                    new_rest = base + extra + rest[len(base):]
                    edits.append(_replace(lines, i, f"{indent}{on}{head} {kind}{new_rest}",
                                          "optimizer-hyper"))
        else:  # the weight decay's meaning: adam (L2) vs adamw (decoupled)
            other = {"adam": "adamw", "adamw": "adam"}[kind]
            edits.append(_replace(lines, i, f"{indent}{on}{head} {other}{rest}",
                                  "optimizer-kind"))
            if "eps=" not in rest:
                new_rest = base + " eps=1e-6" + rest[len(base):]
                edits.append(_replace(lines, i, f"{indent}{on}{head} {kind}{new_rest}",
                                      "optimizer-hyper"))
        if head == "optimizer" and not on:  # ZeRO-1 sharding
            sm = re.search(r"\s+shard over (.*)$", rest)
            data_axes = [a for a in axes if a not in ("tp", "pp")]
            if sm:
                edits.append(_replace(lines, i, f"{indent}{head} {kind}{base}",
                                      "optimizer-shard"))
                shard = [a.strip() for a in sm.group(1).split(",")]
                if len(shard) > 1:
                    edits.append(_replace(lines, i, f"{indent}{head} {kind}{base} shard over "
                                          f"{', '.join(reversed(shard))}", "optimizer-shard"))
                    edits.append(_replace(lines, i, f"{indent}{head} {kind}{base} shard over "
                                          f"{shard[0]}", "optimizer-shard"))
                for a in axes:
                    if a not in shard:
                        edits.append(_replace(lines, i, f"{indent}{head} {kind}{base} shard "
                                              f"over {', '.join(shard + [a])}",
                                              "optimizer-shard"))
            else:
                for a in data_axes + [a for a in axes if a == "tp"]:
                    edits.append(_replace(lines, i, f"{indent}{head} {kind}{rest} shard over "
                                          f"{a}", "optimizer-shard"))
    if plan_opt is not None and "dp" in axes:  # a per-rank override inserted after it
        i, kind, rest = plan_opt
        base = re.sub(r"\s+shard over .*$", "", rest)
        lr = re.search(r"lr=([0-9.e\-/]+)", base)
        overrides = [(f"on dp=1: optimizer {kind}{base}", True)]
        if lr:
            for v in _number_variants(lr.group(1))[:2]:
                overrides.append((f"on dp=1: optimizer {kind} lr={v}", False))
        for text, equivalent in overrides:
            out = list(lines)
            out.insert(i + 1, text)
            edits.append(("optimizer-override", f"L{i + 2} inserted: {text!r}", out, [i + 2],
                          "(none)", text, equivalent))
    return edits


def clip_edits(lines: list[str], axes: list[str]) -> list[Edit]:
    edits: list[Edit] = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)clip-grad-norm\s+(\S+)(.*)$", _code(line))
        if m is None:
            continue
        indent, value, rest = m.groups()
        for v in _number_variants(value):
            edits.append(_replace(lines, i, f"{indent}clip-grad-norm {v}{rest}", "clip"))
        om = re.search(r"over ([\w, ]+?)(\s+replicas=\w+)?$", rest)
        clip_axes = [a.strip() for a in om.group(1).split(",")] if om else []
        tail = (om.group(2) or "") if om else rest
        for choice in ([], *[[a] for a in axes], [a for a in axes if a != "pp"]):
            if choice != clip_axes:
                over = f" over {', '.join(choice)}" if choice else ""
                edits.append(_replace(lines, i, f"{indent}clip-grad-norm {value}{over}{tail}",
                                      "clip"))
        for rep in ("each", "once"):
            if f"replicas={rep}" not in rest:
                base = re.sub(r"\s+replicas=\w+", "", rest)
                edits.append(_replace(lines, i, f"{indent}clip-grad-norm {value}{base} "
                                      f"replicas={rep}", "clip",
                                      equivalent=rep == "once" and "replicas=" not in rest))
    return edits


def step_edits(lines: list[str], axes: list[str]) -> list[Edit]:
    """loss-scale, microbatches, loss-reduction."""
    edits: list[Edit] = []
    mb_line = next((i for i, line in enumerate(lines) if _code(line).startswith("microbatches")),
                   None)
    mesh_line = next(i for i, line in enumerate(lines) if _code(line).startswith("mesh"))
    has_scale = False
    mbs = 1
    if mb_line is not None:
        mm = re.match(r"^microbatches\s+(\d+)(.*)$", _code(lines[mb_line]))
        if mm:
            mbs = int(mm.group(1))
            for n in sorted({1, 2, 4, mbs * 2} - {mbs}):
                edits.append(_replace(lines, mb_line, f"microbatches {n}{mm.group(2)}",
                                      "microbatches"))
    for i, line in enumerate(lines):
        m = re.match(r"^loss-scale\s+(.*)$", _code(line))
        if m:
            has_scale = True
            for v in ("1", "1/2", "1/4", "2/microbatches", "1/(2*microbatches)",
                      f"1/{mbs}", "0.5000001"):
                if v != m.group(1).strip():
                    edits.append(_replace(lines, i, f"loss-scale {v}", "loss-scale",
                                          equivalent=v == f"1/{mbs}"))
        m = re.match(r"^loss-reduction\s+(.*)$", _code(line))
        if m:
            for v in ("local-mean", "token-mean over dp", "sum scale=1/32", "sum scale=1/16"):
                if v != m.group(1).strip():
                    edits.append(_replace(lines, i, f"loss-reduction {v}", "loss-reduction",
                                          equivalent=v == "token-mean over dp" and axes == ["dp"]))
    at = (mb_line if mb_line is not None else mesh_line) + 1
    if not has_scale:
        for v in ("1/microbatches", "1/2"):
            out = list(lines)
            out.insert(at, f"loss-scale {v}")
            edits.append(("loss-scale", f"L{at + 1} inserted: 'loss-scale {v}'", out, [at + 1],
                          "(none)", f"loss-scale {v}", v == "1/microbatches" and
                          not any(_code(x).startswith("loss-reduction") for x in lines)))
    if mb_line is None:
        out = list(lines)
        out.insert(mesh_line + 1, "microbatches 2")
        edits.append(("microbatches", f"L{mesh_line + 2} inserted: 'microbatches 2'", out,
                      [mesh_line + 2], "(none)", "microbatches 2", False))
    return edits


def pipeline_edits(lines: list[str]) -> list[Edit]:
    edits: list[Edit] = []
    stages = [(i, re.match(r"^pipeline-stage\s+(\d+):\s*(.*)$", _code(line)))
              for i, line in enumerate(lines)]
    stages = [(i, m) for i, m in stages if m]
    for (i, mi), (j, mj) in zip(stages, stages[1:], strict=False):
        left, right = _split_top(mi.group(2)), _split_top(mj.group(2))

        def two(new_left: list[str], new_right: list[str], what: str,
                mi=mi, mj=mj, i=i, j=j) -> Edit:
            out = list(lines)
            a = f"pipeline-stage {mi.group(1)}: {', '.join(new_left)}"
            b = f"pipeline-stage {mj.group(1)}: {', '.join(new_right)}"
            out[i], out[j] = a, b
            return ("pipeline-stage", f"{what}: L{i + 1} {a!r}, L{j + 1} {b!r}", out,
                    [i + 1, j + 1], f"{lines[i].strip()} / {lines[j].strip()}", f"{a} / {b}",
                    False)

        if len(left) > 1:
            edits.append(two(left[:-1], [left[-1]] + right, "last module of a stage moved on"))
        if len(right) > 1:
            edits.append(two(left + [right[0]], right[1:], "first module of a stage moved back"))
        # stage numbers swapped
        out = list(lines)
        out[i] = f"pipeline-stage {mj.group(1)}: {mi.group(2)}"
        out[j] = f"pipeline-stage {mi.group(1)}: {mj.group(2)}"
        edits.append(("pipeline-stage", f"stage numbers swapped: L{i + 1}, L{j + 1}", out,
                      [i + 1, j + 1], "", "", False))
    for i, m in stages:  # chunk order within a stage (virtual stages)
        items = _split_top(m.group(2))
        chunks = [k for k, x in enumerate(items) if x.startswith("layers[")]
        if len(chunks) > 1:
            es = list(items)
            es[chunks[0]], es[chunks[1]] = es[chunks[1]], es[chunks[0]]
            edits.append(_replace(lines, i, f"pipeline-stage {m.group(1)}: {', '.join(es)}",
                                  "pipeline-stage"))
        for k, x in enumerate(items):  # a layer range widened / narrowed by one
            rm = re.fullmatch(r"layers\[(\d+):(\d+)\]", x)
            if rm:
                a, b = int(rm.group(1)), int(rm.group(2))
                for na, nb in ((a, b + 1), (a + 1, b)):
                    es = list(items)
                    es[k] = f"layers[{na}:{nb}]"
                    edits.append(_replace(lines, i, f"pipeline-stage {m.group(1)}: "
                                          f"{', '.join(es)}", "pipeline-stage"))
    return edits


def algorithm_edits(lines: list[str], axes: list[str], in_template: bool) -> list[Edit]:
    edits: list[Edit] = []
    axis_words = axes + (["axis"] if in_template else [])
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)algorithm\s+(\S+)\s+for\s+(.*?)\s+over\s+(\S+)(.*)$", _code(line))
        if m is None:
            continue
        indent, name, targets, axis, rest = m.groups()
        for other in axis_words:
            if other != axis:
                edits.append(_replace(lines, i, f"{indent}algorithm {name} for {targets} over "
                                      f"{other}{rest}", "over-axis"))
        if name == "context-parallel-attention":
            for order in ("zigzag", "contiguous"):
                edits.append(_replace(lines, i, f"{indent}algorithm {name} for {targets} over "
                                      f"{axis}{rest} order={order}", "algorithm",
                                      equivalent=order == "contiguous"))
        if name == "vocab-parallel-cross-entropy":
            for s in ("vocabulary", "partition"):
                edits.append(_replace(lines, i, f"{indent}algorithm {name} for {targets} over "
                                      f"{axis}{rest} smoothing={s}", "algorithm"))
        for other in ("row-parallel-linear", "vocab-parallel-embedding",
                      "vocab-parallel-cross-entropy", "context-parallel-attention"):
            if other != name:
                edits.append(_replace(lines, i, f"{indent}algorithm {other} for {targets} over "
                                      f"{axis}{rest}", "algorithm"))
    return edits


def apply_edits(lines: list[str], library: dict[str, tuple[list[str], int, int, int]]
                ) -> list[Edit]:
    """A template `apply` replaced by another template taking as many arguments."""
    edits: list[Edit] = []
    for i, line in enumerate(lines):
        m = APPLY_RE.match(_code(line))
        if m is None:
            continue
        indent, name, args = m.groups()
        n = len(_split_top(args))
        for other, (params, required, _, _) in sorted(library.items()):
            if other != name and required <= n <= len(params) and \
                    len(params) == len(library.get(name, (params,))[0]):
                edits.append(_replace(lines, i, f"{indent}apply {other}({args})", "apply"))
    return edits


def mesh_edits(lines: list[str], axes: list[str]) -> list[Edit]:
    edits: list[Edit] = []
    for i, line in enumerate(lines):
        m = re.match(r"^mesh\s+(.*)$", _code(line))
        if m is None:
            continue
        parts = [p.strip() for p in m.group(1).split(",")]
        if len(parts) > 1 and not any(p.startswith("pp=") for p in parts):
            # the order of the axes changes the rank numbering only: a correct rewrite
            edits.append(_replace(lines, i, f"mesh {', '.join(reversed(parts))}", "mesh-order",
                                  equivalent=True))
        for k, p in enumerate(parts):
            a, size = p.split("=")
            for s in (1, 4):
                if str(s) != size:
                    ps = list(parts)
                    ps[k] = f"{a}={s}"
                    edits.append(_replace(lines, i, f"mesh {', '.join(ps)}", "mesh-size"))
    return edits


RENAMES = {"tp": "model", "dp": "data", "cp": "ctx", "zp": "zero", "pp": "pipe"}


def rename_edits(lines: list[str], axes: list[str]) -> list[Edit]:
    """Correct rewrites: a mesh axis renamed everywhere in the plan; the loop variable."""
    edits: list[Edit] = []
    for axis in axes:
        new_name = RENAMES.get(axis, axis + "x")
        pattern = re.compile(rf"(?<![\w.\-]){axis}(?![\w\-])")
        out, changed = [], []
        for k, line in enumerate(lines):
            code, _, comment = line.partition("#")
            new_code = pattern.sub(new_name, code)
            out.append(new_code + (("#" + comment) if _ else ""))
            if new_code != code:
                changed.append(k + 1)
        if changed:
            # `pp` is the pipeline axis by its name (docs/language.md): renaming it is
            # refused (TVP240), not a correct rewrite
            edits.append(("rename", f"mesh axis {axis} renamed {new_name} everywhere "
                          f"(lines {changed})", out, [], axis, new_name, axis != "pp"))
    loop = [k for k, line in enumerate(lines) if re.match(r"^for\s+l\s+in\b", _code(line))]
    if loop:
        pattern = re.compile(r"(?<![\w.\-])l(?=[.\s])")
        out = [pattern.sub("blk", _code(line)) + line[len(_code(line)):]
               if re.match(r"^(for\s+l\b|\s+)", line) else line for line in lines]
        edits.append(("rename", "loop variable l renamed blk", out, [], "l", "blk", True))
    return edits


def template_rename_edits(lines: list[str], used: list[str],
                          library: dict[str, tuple[list[str], int, int, int]]) -> list[Edit]:
    """Correct rewrites inside the template copy: one used template's parameter renamed."""
    edits: list[Edit] = []
    for name in used:
        params, _, first, last = library[name]
        for p in params:
            new_p = p + "_r"
            pattern = re.compile(rf"(?<![\w.\-]){re.escape(p)}(?![\w\-])")
            out = list(lines)
            for k in range(first - 1, last):
                code, sep, comment = out[k].partition("#")
                out[k] = pattern.sub(new_p, code) + sep + comment
            edits.append(("rename", f"template {name}: parameter {p} renamed {new_p}", out, [],
                          p, new_p, True))
    return edits


PLAN_KINDS = ("collective-kind", "over-axis", "op", "backward", "backward-explicit", "dim",
              "after", "duplicate", "split", "delete", "optimizer-hyper", "optimizer-kind",
              "optimizer-shard", "optimizer-override", "clip", "loss-scale", "microbatches",
              "loss-reduction", "pipeline-stage", "algorithm", "apply", "mesh-order",
              "mesh-size", "rename")


def candidates(plan: str) -> dict[str, list[Mutant]]:
    """Every mutant of ``plan`` by kind (``template:KIND`` for edits inside the template
    copy), deduplicated by text."""
    path = ROOT / "plans" / f"{plan}.tvp"
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    axes = mesh_axes(text)
    lib_text = MEGATRON.read_text(encoding="utf-8")
    library = templates(lib_text)
    edits = (collective_edits(lines, axes, False) + split_edits(lines, axes, False) +
             delete_edits(lines) + optimizer_edits(lines, axes) + clip_edits(lines, axes) +
             step_edits(lines, axes) + pipeline_edits(lines) +
             algorithm_edits(lines, axes, False) + apply_edits(lines, library) +
             mesh_edits(lines, axes) + rename_edits(lines, axes))
    out: dict[str, list[Mutant]] = {}
    seen = {text}
    for kind, desc, new_lines, mutated, old, new, equivalent in edits:
        new_text = "\n".join(new_lines)
        if new_text in seen:
            continue
        seen.add(new_text)
        out.setdefault(kind, []).append(Mutant(plan, kind, "plan", desc, new_text, None,
                                               mutated, old, new, equivalent))
    if USE_MEGATRON in text:
        used = used_templates(text, library, lib_text)
        lib_lines = lib_text.split("\n")
        plan_text = text.replace(USE_MEGATRON, f'use "{TEMPLATE_COPY}"')
        inside = set()
        for name in used:
            _, _, first, last = library[name]
            inside.update(range(first, last))  # 0-based indices of the body lines
        body_only = [line if k in inside else "" for k, line in enumerate(lib_lines)]
        t_edits = (collective_edits(body_only, axes, True) + split_edits(body_only, axes, True) +
                   algorithm_edits(body_only, axes, True) + apply_edits(body_only, library) +
                   delete_edits(body_only))
        t_seen = {lib_text}
        for kind, desc, new_lines, mutated, old, new, equivalent in t_edits:
            # carry the edit over to the real template text (the other lines unchanged)
            full = list(lib_lines)
            if kind == "delete":
                k = next(k for k in range(len(body_only)) if k >= len(new_lines) or
                         body_only[k] != new_lines[k])
                del full[k]
            elif kind == "duplicate":
                k = mutated[0] - 1
                full.insert(k + 1, full[k])
            else:
                k = mutated[0] - 1
                full[k] = new_lines[k]
            new_text = "\n".join(full)
            if new_text in t_seen:
                continue
            t_seen.add(new_text)
            out.setdefault(f"template:{kind}", []).append(Mutant(
                plan, kind, "template", f"{TEMPLATE_COPY} {desc}", plan_text, new_text,
                mutated, old, new, equivalent))
        for kind, desc, new_lines, mutated, old, new, equivalent in \
                template_rename_edits(lib_lines, used, library):
            out.setdefault("template:rename", []).append(Mutant(
                plan, kind, "template", f"{TEMPLATE_COPY} {desc}", plan_text,
                "\n".join(new_lines), mutated, old, new, equivalent))
        # the unchanged template copy: the `use` path rewrite alone must stay verified
        out.setdefault("template:rename", []).append(Mutant(
            plan, "use-copy", "template", f"use rewritten to a verbatim copy {TEMPLATE_COPY}",
            plan_text, lib_text, [], USE_MEGATRON, f'use "{TEMPLATE_COPY}"', True))
    return out


def draw(plans: list[str], count: int, seed: int) -> list[Mutant]:
    """``count`` distinct mutants: plans in turn, then a kind, then a candidate, all drawn
    from ``random.Random(seed)``."""
    rng = random.Random(seed)
    pools = {p: candidates(p) for p in plans}
    picked: list[Mutant] = []
    seen: set[tuple[str, str, str | None]] = set()
    for k in range(count):
        plan = plans[k % len(plans)]
        pool = pools[plan]
        for _ in range(50):
            kinds = sorted(pool)
            plan_kinds = [x for x in kinds if not x.startswith("template:")]
            template_kinds = [x for x in kinds if x.startswith("template:")]
            scope = template_kinds if template_kinds and rng.random() < 0.3 else plan_kinds
            kind = rng.choice(scope)
            mutant = rng.choice(pool[kind])
            key = (plan, mutant.plan_text, mutant.template_text)
            if key not in seen:
                seen.add(key)
                picked.append(mutant)
                break
    return picked


# ---------------------------------------------------------------- running one mutant


class CommandTimeout(Exception):
    pass


def worker(folder: str) -> int:
    """Run lint --spec, simulate and check on ``folder/plan.tvp`` in this (fresh) process
    through the CLI's entry point; write ``folder/result.json``."""
    import signal
    import warnings

    warnings.filterwarnings("ignore")
    from trainverify_dsl.cli.main import main

    plan = str(Path(folder) / "plan.tvp")
    commands = {
        "lint": ["lint", "--spec", "--format", "json", plan],
        "simulate": ["simulate", "--format", "json", plan],
        "check": ["check", "--format", "json", "--time-limit", str(CHECK_TIME_LIMIT),
                  "--no-cache", plan],
    }

    def alarm(signum, frame):
        raise CommandTimeout()

    signal.signal(signal.SIGALRM, alarm)
    result = {}
    for name, argv in commands.items():
        out, err = io.StringIO(), io.StringIO()
        start = time.perf_counter()
        rc, exc = None, None
        signal.alarm(LIMITS[name])
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = main(argv)
        except CommandTimeout:
            exc = f"timeout after {LIMITS[name]} s"
        except SystemExit as error:
            rc = error.code if isinstance(error.code, int) else 2
        except BaseException:  # noqa: BLE001 - a crash is what we look for
            exc = traceback.format_exc()
        finally:
            signal.alarm(0)
        result[name] = {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(),
                        "exception": exc, "seconds": round(time.perf_counter() - start, 2)}
    (Path(folder) / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


def run_mutant(folder: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TVP_CACHE_DIR=str(SCRATCH / "cache"), PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker",
                               str(folder)], cwd=SCRATCH, env=env, capture_output=True,
                              text=True, timeout=WORKER_LIMIT)
        died = None if proc.returncode == 0 else \
            f"worker exit {proc.returncode}: {proc.stderr[-2000:]}"
    except subprocess.TimeoutExpired:
        died = f"worker killed after {WORKER_LIMIT} s"
    wall = time.perf_counter() - start
    path = folder / "result.json"
    result = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    result["worker_error"] = died if not path.is_file() or died else None
    result["wall"] = round(wall, 2)
    return result


def _json(text: str) -> dict | None:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return None


@dataclass
class Outcome:
    lint_rc: int | None = None
    lint_errors: int = 0
    lint_line: str = ""
    sim_rc: int | None = None
    sim_verdict: str = "?"
    sim_line: str = ""
    check_rc: int | None = None
    check_verdict: str = "?"
    check_reason: str = ""
    check_line: str = ""
    check_diag_line: str = ""
    crash: str = ""
    seconds: dict = field(default_factory=dict)


TORCH_LOG = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")


def _loc(file: str | None, line: int | None) -> str:
    return f"{Path(file).name}:{line}" if file and line else ""


def outcome(result: dict) -> Outcome:
    o = Outcome()
    crashes = []
    if result.get("worker_error"):
        crashes.append(result["worker_error"])
    for name in ("lint", "simulate", "check"):
        r = result.get(name)
        if r is None:
            continue
        o.seconds[name] = r["seconds"]
        if r["exception"]:
            crashes.append(f"{name}: {r['exception'].strip().splitlines()[-1]}"
                           if "timeout" not in r["exception"] else "")
            if "timeout" in r["exception"]:
                o.seconds[name + "_timeout"] = True
        # torch logs the exceptions its fake tensors raise (lines `E1205 19:11:22.36 ...`)
        # even when the project catches them: those are not crashes
        stderr = "\n".join(line for line in r["stderr"].splitlines()
                           if not TORCH_LOG.match(line))
        if "Traceback (most recent call last)" in stderr:
            crashes.append(f"{name}: traceback on stderr: {stderr.strip().splitlines()[-1]}")
    crashes = [c for c in crashes if c]
    lint = result.get("lint") or {}
    o.lint_rc = lint.get("rc")
    doc = _json(lint.get("stdout", ""))
    if doc:
        errors = [d for d in doc.get("diagnostics", []) if d.get("severity") == "error"]
        o.lint_errors = len(errors)
        if errors:
            o.lint_line = f"{_loc(errors[0].get('file'), errors[0].get('line'))} " \
                          f"{errors[0].get('code')}"
        if doc.get("internal_errors"):
            crashes.append(f"lint internal error: {doc['internal_errors']}")
    if o.lint_rc == 2:
        crashes.append(f"lint exit 2: {lint.get('stderr', '').strip()[-300:]}")
    sim = result.get("simulate") or {}
    o.sim_rc = sim.get("rc")
    doc = _json(sim.get("stdout", ""))
    if doc:
        o.sim_verdict = doc.get("verdict", "?")
        first = doc.get("first_difference")
        if first and first.get("span"):
            o.sim_line = _loc(first["span"].get("file"), first["span"].get("line"))
        elif doc.get("findings"):
            errs = [f for f in doc["findings"] if f.get("severity") == "error"]
            if errs and errs[0].get("span"):
                o.sim_line = f"{_loc(errs[0]['span'].get('file'), errs[0]['span'].get('line'))}" \
                             f" {errs[0].get('code')}"
        if o.sim_verdict in ("internal-error", "no-verdict"):
            crashes.append(f"simulate {o.sim_verdict}: {doc.get('error')}")
    chk = result.get("check") or {}
    o.check_rc = chk.get("rc")
    doc = _json(chk.get("stdout", ""))
    if doc:
        o.check_verdict = doc.get("verdict", "?")
        plans = doc.get("plans") or [{}]
        o.check_reason = plans[0].get("reason", "")
        ce = doc.get("counterexample")
        if ce:
            o.check_line = _loc(ce.get("file"), ce.get("line"))
        diags = [d for d in doc.get("diagnostics", []) if d.get("severity") == "error"]
        if diags:
            o.check_diag_line = f"{_loc(diags[0].get('file'), diags[0].get('line'))} " \
                                f"{diags[0].get('code')}"
        if "internal error" in o.check_reason or "symbolic checks failed" in o.check_reason:
            crashes.append(f"check: {o.check_reason}")
    if o.check_rc == 2 and not any(c.startswith("check") for c in crashes) and \
            not (o.sim_verdict == "usage-error" and o.check_verdict == "error"):
        # exit 2 with a usage reason that simulate gives too (a plan without a `spec` line
        # or a `mesh`) is a refusal, not a crash; any other exit 2 is
        crashes.append(f"check exit 2: {o.check_reason or chk.get('stderr', '')[-300:]}")
    if o.sim_rc == 2 and o.sim_verdict not in ("internal-error", "no-verdict") and \
            o.sim_verdict != "usage-error":
        crashes.append(f"simulate exit 2 ({o.sim_verdict})")
    o.crash = "; ".join(crashes)
    return o


def classify(m: Mutant, o: Outcome, timed_out: bool) -> tuple[str, str]:
    """(class, note)."""
    sim_differs = o.sim_verdict in ("differs", "errors")
    if o.crash:
        return "f", o.crash
    if o.check_verdict == "verified" and (sim_differs or o.lint_errors):
        return "d", f"check verified; simulate {o.sim_verdict}, lint errors {o.lint_errors}"
    if o.check_verdict == "verified" and o.sim_verdict == "agrees" and not o.lint_errors:
        return "c", "equivalent"
    if o.lint_errors and o.check_verdict in ("error", "counterexample"):
        return "a", f"lint {o.lint_line}"
    if o.sim_verdict == "usage-error" and o.check_verdict == "error":
        return "a", f"refused by simulate and check (exit 2, usage): {o.check_reason[:120]}" + \
            ("; lint --spec was clean" if not o.lint_errors else "")
    if o.sim_verdict in ("errors",) and o.check_verdict == "error":
        return "a", "refused by the lowering (simulate and check)"
    if not o.lint_errors and o.sim_verdict == "agrees" and \
            o.check_verdict in ("counterexample", "error"):
        return "e", f"check {o.check_verdict} at {o.check_line or o.check_diag_line}: " \
                    f"{o.check_reason[:200]}"
    if sim_differs and o.check_verdict == "counterexample":
        if not m.mutated_lines:
            return "b", f"at {o.check_line} (a deletion or rename: no mutated line)"
        mutated_file = "plan.tvp" if m.where == "plan" else TEMPLATE_COPY
        at = [f"{mutated_file}:{n}" for n in m.mutated_lines]
        if o.check_line in at:
            return "b", f"at the mutated line {o.check_line}"
        return "h", f"check at {o.check_line or '(no line)'}, mutated {', '.join(at)}; " \
                    f"simulate at {o.sim_line or '-'}"
    if timed_out:
        return "g", "a command reached its time limit"
    if o.check_verdict == "inconclusive":
        return "g", f"check inconclusive (simulate {o.sim_verdict}): {o.check_reason[:200]}"
    return "g", f"unclassified: lint errors {o.lint_errors}, simulate {o.sim_verdict}, " \
                f"check {o.check_verdict} ({o.check_reason[:150]})"


def write_mutant(folder: Path, m: Mutant) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "plan.tvp").write_text(m.plan_text, encoding="utf-8")
    if m.template_text is not None:
        (folder / TEMPLATE_COPY).write_text(m.template_text, encoding="utf-8")


def _diff(m: Mutant) -> str:
    if m.where == "template":
        old = MEGATRON.read_text(encoding="utf-8").split("\n")
        new = (m.template_text or "").split("\n")
        name = "stdlib/megatron.tvp"
    else:
        old = (ROOT / "plans" / f"{m.plan}.tvp").read_text(encoding="utf-8").split("\n")
        new = m.plan_text.split("\n")
        name = f"plans/{m.plan}.tvp"
    return "\n".join(difflib.unified_diff(old, new, name, f"mutant/{Path(name).name}",
                                          n=1, lineterm=""))


def confirm(folder: Path, oracle: bool) -> dict:
    """The three commands again as separate `tvp` processes (and the gloo oracle)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TVP_CACHE_DIR=str(SCRATCH / "cache"))
    tvp = str(Path(sys.executable).parent / "tvp")
    plan = str(folder / "plan.tvp")
    commands = {
        "lint": [tvp, "lint", "--spec", "--format", "json", plan],
        "simulate": [tvp, "simulate", "--format", "json", plan],
        "check": [tvp, "check", "--format", "json", "--time-limit", str(CHECK_TIME_LIMIT),
                  "--no-cache", plan],
    }
    if oracle:
        commands["run-distributed"] = [tvp, "run-distributed", "--timeout",
                                       str(ORACLE_TIMEOUT), plan]
    out = {}
    for name, argv in commands.items():
        start = time.perf_counter()
        try:
            proc = subprocess.run(argv, cwd=SCRATCH, env=env, capture_output=True, text=True,
                                  timeout=ORACLE_TIMEOUT + 300)
            out[name] = {"rc": proc.returncode, "stdout": proc.stdout[-20000:],
                         "stderr": proc.stderr[-5000:]}
        except subprocess.TimeoutExpired:
            out[name] = {"rc": None, "stdout": "", "stderr": "timeout"}
        out[name]["seconds"] = round(time.perf_counter() - start, 2)
    return out


def save_finding(index: int, cls: str, m: Mutant, folder: Path, result: dict, o: Outcome,
                 note: str) -> Path:
    target = SCRATCH / "findings" / f"{index:04d}-{cls}-{m.plan}"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(folder, target)
    shutil.copy(ROOT / "plans" / f"{m.plan}.tvp", target / "original.tvp")
    (target / "mutation.diff").write_text(_diff(m) + "\n", encoding="utf-8")
    info = {"index": index, "class": cls, "note": note, "mutant": {
        k: v for k, v in asdict(m).items() if k not in ("plan_text", "template_text")},
        "outcome": asdict(o)}
    if cls in ("d", "e", "f"):
        info["confirmation"] = confirm(target, oracle=cls in ("d", "e"))
        (target / "confirmation.json").write_text(json.dumps(info["confirmation"], indent=1),
                                                  encoding="utf-8")
    (target / "finding.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    return target


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def baseline(plans: list[str]) -> list[str]:
    """The plans whose original verifies (lint clean, simulate agrees, check verified)."""
    good = []
    for plan in plans:
        folder = SCRATCH / "baseline" / plan
        text = (ROOT / "plans" / f"{plan}.tvp").read_text(encoding="utf-8")
        write_mutant(folder, Mutant(plan, "original", "plan", "", text, None, [], "", ""))
        result = run_mutant(folder)
        o = outcome(result)
        ok = not o.crash and not o.lint_errors and o.sim_verdict == "agrees" and \
            o.check_verdict == "verified"
        print(f"baseline {plan:24s} lint={o.lint_rc} simulate={o.sim_verdict} "
              f"check={o.check_verdict} {result['wall']:.1f}s {'ok' if ok else 'SKIPPED'}",
              flush=True)
        if ok:
            good.append(plan)
    return good


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plans", nargs="+", default=list(PLANS))
    parser.add_argument("--budget", type=float, default=0,
                        help="stop drawing new mutants after this many seconds (0: none)")
    parser.add_argument("--list", action="store_true",
                        help="print the candidate counts per plan and kind, and the drawn "
                             "mutants, without running them")
    parser.add_argument("--report", metavar="LOG",
                        help="re-classify the rows of a run's log (run-seedS.jsonl) with this "
                             "script's rules and print the summary; --seed, --count and "
                             "--plans must be the run's (the mutants are drawn again)")
    parser.add_argument("--recheck", metavar="DIR", nargs="+",
                        help="run the three commands again, as separate tvp processes, on "
                             "finding folders (/tmp/check_fuzz/findings/*) and print what "
                             "they say now (the code under test may have changed)")
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.recheck:
        return recheck([Path(d) for d in args.recheck])
    if args.worker:
        return worker(args.worker)
    if args.report:
        return report(Path(args.report), args.plans, args.count, args.seed)
    start = time.perf_counter()
    if args.list:
        for plan in args.plans:
            pool = candidates(plan)
            print(plan, {k: len(v) for k, v in sorted(pool.items())})
        for k, m in enumerate(draw(args.plans, args.count, args.seed)):
            print(f"[{k:4d}] {m.plan:24s} {m.where:8s} {m.kind:18s} {m.description}")
        return 0
    SCRATCH.mkdir(parents=True, exist_ok=True)
    (SCRATCH / "findings").mkdir(exist_ok=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "trainverify_dsl", "stdlib"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"check_fuzz: seed {args.seed}, count {args.count}, commit {head}"
          f"{' (trainverify_dsl/stdlib modified in the working tree)' if dirty else ''}",
          flush=True)
    plans = baseline(args.plans)
    mutants = draw(plans, args.count, args.seed)
    rows = []
    log = (SCRATCH / f"run-seed{args.seed}.jsonl").open("w", encoding="utf-8")
    for index, m in enumerate(mutants):
        if args.budget and time.perf_counter() - start > args.budget:
            print(f"budget of {args.budget:.0f} s reached after {index} mutants", flush=True)
            break
        folder = SCRATCH / "mutants" / f"{index:04d}"
        # the code under test may change during a long run (a shared checkout): each row
        # names the commit it ran on
        started = time.strftime("%H:%M:%S")
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
        write_mutant(folder, m)
        result = run_mutant(folder)
        o = outcome(result)
        timed_out = any(k.endswith("_timeout") for k in o.seconds) or \
            bool(result.get("worker_error") and "killed" in result["worker_error"])
        cls, note = classify(m, o, timed_out)
        if m.equivalent and cls != "c":
            note += " [a correct rewrite not verified]"
        saved = save_finding(index, cls, m, folder, result, o, note) \
            if cls in FINDING_CLASSES else None
        row = {"index": index, "plan": m.plan, "kind": m.kind, "where": m.where,
               "description": m.description, "equivalent": m.equivalent, "class": cls,
               "mutated_lines": m.mutated_lines, "started": started, "commit": commit,
               "note": note, "wall": result["wall"], "outcome": asdict(o),
               "finding": str(saved) if saved else None}
        rows.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()
        where = "T " if m.where == "template" else ""
        print(f"[{index:4d}] {cls} {m.plan:22s} {where}{m.kind:18s} "
              f"lint={o.lint_rc}({o.lint_errors}) sim={o.sim_verdict:7s} "
              f"check={o.check_verdict}{'@' + o.check_line if o.check_line else ''} "
              f"{result['wall']:6.1f}s  {_short(m.description, 110)}"
              f"{'  <- ' + _short(note, 160) if cls in FINDING_CLASSES or cls == 'g' else ''}",
              flush=True)
    log.close()
    summary(rows, time.perf_counter() - start)
    return 0


def recheck(folders: list[Path]) -> int:
    """Each finding's mutant through lint --spec, simulate and check again (fresh
    processes); the outputs are written to ``recheck.json`` beside it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    for folder in folders:
        info = json.loads((folder / "finding.json").read_text(encoding="utf-8"))
        result = confirm(folder, oracle=False)
        for r in result.values():
            r["exception"] = None
        result["commit"] = head
        (folder / "recheck.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
        o = outcome(result)
        m = Mutant(**{**info["mutant"], "plan_text": "", "template_text": None})
        cls, note = classify(m, o, False)
        print(f"{folder.name}: now {cls} at {head}: lint={o.lint_rc}({o.lint_errors}"
              f"{' ' + o.lint_line if o.lint_line else ''}) sim={o.sim_verdict}"
              f"{'@' + o.sim_line if o.sim_line else ''} check={o.check_verdict}"
              f"{'@' + o.check_line if o.check_line else ''}"
              f"{' ' + o.check_diag_line if o.check_diag_line else ''} -- {note[:200]}",
              flush=True)
    return 0


def report(log: Path, plans: list[str], count: int, seed: int) -> int:
    """The rows of ``log`` classified again (the mutants drawn again from the seed)."""
    rows = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]
    mutants = draw(plans, count, seed)
    changed = 0
    for row in rows:
        m = mutants[row["index"]]
        assert m.description == row["description"], (row["index"], m.description)
        o = Outcome(**row["outcome"])
        o.crash = "; ".join(part for part in o.crash.split("; ") if not re.match(
            r"^(lint|simulate|check): traceback on stderr: [EWI]\d{4} ", part))
        if o.check_rc == 2 and o.sim_verdict == "usage-error" and o.check_verdict == "error" \
                and "internal error" not in o.check_reason:
            o.crash = "; ".join(part for part in o.crash.split("; ")
                                if not part.startswith("check exit 2"))
        timed_out = any(k.endswith("_timeout") for k in o.seconds)
        cls, note = classify(m, o, timed_out)
        if m.equivalent and cls != "c":
            note += " [a correct rewrite not verified]"
        if cls != row["class"]:
            changed += 1
            print(f"[{row['index']}] {row['class']} -> {cls}: {note}")
        row["class"], row["note"], row["mutated_lines"] = cls, note, m.mutated_lines
    print(f"{changed} rows re-classified")
    summary(rows, sum(r["wall"] for r in rows))
    return 0


def summary(rows: list[dict], wall: float) -> None:
    print()
    print(f"{len(rows)} mutants in {wall:.0f} s")
    counts = {c: sum(1 for r in rows if r["class"] == c) for c in CLASSES}
    print("| class | meaning | mutants |")
    print("|---|---|---|")
    for c, meaning in CLASSES.items():
        print(f"| {c} | {meaning} | {counts[c]} |")
    kinds = sorted({r["kind"] if r["where"] == "plan" else f"template:{r['kind']}"
                    for r in rows})
    print()
    print("| kind | " + " | ".join(CLASSES) + " |")
    print("|---|" + "---|" * len(CLASSES))
    for kind in kinds:
        sel = [r for r in rows if (r["kind"] if r["where"] == "plan"
                                   else f"template:{r['kind']}") == kind]
        print(f"| {kind} | " + " | ".join(str(sum(1 for r in sel if r["class"] == c))
                                         for c in CLASSES) + " |")
    print()
    print("| plan | " + " | ".join(CLASSES) + " |")
    print("|---|" + "---|" * len(CLASSES))
    for plan in sorted({r["plan"] for r in rows}):
        sel = [r for r in rows if r["plan"] == plan]
        print(f"| {plan} | " + " | ".join(str(sum(1 for r in sel if r["class"] == c))
                                         for c in CLASSES) + " |")
    equiv = [r for r in rows if r["equivalent"]]
    if equiv:
        print(f"\ncorrect rewrites: {len(equiv)}, verified {sum(r['class'] == 'c' for r in equiv)}")
    findings = [r for r in rows if r["class"] in FINDING_CLASSES]
    if findings:
        print("\nfindings:")
        for r in findings:
            print(f"  [{r['index']}] {r['class']} {r['plan']} {r['description']}: {r['note']} "
                  f"-> {r['finding']}")


if __name__ == "__main__":
    sys.exit(main())
