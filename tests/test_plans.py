"""The shipped plans (`plans/**/*.tvp`) and plan library (`stdlib/*.tvp`).

Every file parses, every plan lints clean and is already in canonical form, every stdlib
template is used by some plan, every tensor and module a plan names exists in its spec model
(the linter cannot know the module tree without torch; this test builds the models on the meta
device), and every bug plan names its faulty line and differs from its correct twin only there.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import cache
from pathlib import Path

import pytest

from trainverify_dsl.parse import ast, format_source, parse_file
from trainverify_dsl.plan import Plan, lint_file, resolve_file
from trainverify_dsl.plan.model import Shard

ROOT = Path(__file__).resolve().parent.parent
PLANS = sorted((ROOT / "plans").rglob("*.tvp"))
BUG_PLANS = sorted((ROOT / "plans" / "bugs").glob("*.tvp"))
FRAGMENTS = sorted((ROOT / "stdlib").glob("*.tvp"))
QUICK_START = ROOT / "plans" / "llama3_8b_3d.tvp"

#: The TrainVerify paper's configurations (MODELS.md) and the other plans the README promises.
EXPECTED_PLANS = (
    "mlp_dp_tp", "gpt2_3d", "llama3_8b_3d", "llama3_8b_dp", "llama3_70b", "llama3_405b",
    "deepseek_v3_16b", "deepseek_v3_236b", "deepseek_v3_671b",
)
#: The classic bugs of DESIGN.md §4, one plan each.
EXPECTED_BUGS = (
    "missing_allreduce", "doubled_allreduce", "allgather_instead_of_allreduce", "wrong_axis",
    "loss_not_scaled", "loss_scaled_twice", "avg_instead_of_sum", "sum_instead_of_avg",
    "sp_norm_grad_not_reduced", "expert_grads_wrong_group", "backward_allreduce",
    "send_wrong_stage", "vocab_ce_on_gathered_logits",
)
#: Templates no shipped plan applies yet, with the reason (kept honest by a test below).
UNUSED_TEMPLATES: dict[str, str] = {}
#: (paper configuration, plan): mesh axis sizes as published (dp may be split as dp x ep).
PAPER_MESHES = {
    "llama3_8b_dp": {"dp": 512},
    "llama3_70b": {"dp": 16, "tp": 8, "pp": 4},
    "llama3_405b": {"dp": 64, "tp": 8, "pp": 16},
    "deepseek_v3_16b": {"dp": 16, "tp": 4, "pp": 2},
    "deepseek_v3_236b": {"dp": 16, "tp": 8, "pp": 4},
    "deepseek_v3_671b": {"dp": 32, "tp": 8, "pp": 8},
}
PAPER_MICROBATCHES = {"llama3_8b_dp": 1, "llama3_70b": 32, "llama3_405b": 16,
                      "deepseek_v3_16b": 16, "deepseek_v3_236b": 16, "deepseek_v3_671b": 16}

BUG_HEADER = re.compile(r"^# bug: .+ \((?:missing after )?line (\d+)\)\.$")
TWIN_LINE = re.compile(r"^# The correct plan is plans/(\w+)\.tvp;")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def describe(diagnostics) -> str:
    return "\n".join(f"{d.span}: {d.code.id} {d.message}" for d in diagnostics)


@cache
def resolved(path: Path) -> Plan:
    result = resolve_file(path, project_root=ROOT)
    assert result.plan is not None, describe(result.diagnostics)
    return result.plan


# ---------------------------------------------------------------- inventory


def test_quick_start_plan_exists() -> None:
    assert QUICK_START.is_file()
    assert "plan llama3_8b_3d\n" in QUICK_START.read_text()


@pytest.mark.parametrize("name", EXPECTED_PLANS)
def test_expected_plan_exists(name: str) -> None:
    assert (ROOT / "plans" / f"{name}.tvp").is_file()


@pytest.mark.parametrize("name", EXPECTED_BUGS)
def test_expected_bug_plan_exists(name: str) -> None:
    assert (ROOT / "plans" / "bugs" / f"{name}.tvp").is_file()


@pytest.mark.parametrize("path", PLANS, ids=rel)
def test_plan_starts_with_a_comment_block(path: Path) -> None:
    lines = path.read_text().splitlines()
    header = lines[:next(n for n, line in enumerate(lines) if line.startswith("plan "))]
    assert len(header) >= 3 and all(line.startswith("#") or not line for line in header)
    assert lines[0].startswith("# ")


@pytest.mark.parametrize("path", PLANS + FRAGMENTS, ids=rel)
def test_lines_fit_in_100_columns(path: Path) -> None:
    long = [n for n, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 100]
    assert not long, f"lines longer than 100 columns: {long}"


# ---------------------------------------------------------------- parse, lint, format


@pytest.mark.parametrize("path", PLANS + FRAGMENTS, ids=rel)
def test_parses_without_diagnostics(path: Path) -> None:
    result = parse_file(path)
    assert result.plan_file is not None
    assert not result.diagnostics, describe(result.diagnostics)


#: Bug plans whose bug the linter itself reports (no spec, no torch): the code, at the
#: ``# BUG`` line. Every other plan, bug plans included, lints clean.
LINT_BUGS = {"interleaved_without_virtual_stages": "TVP247", "optimizer_eps_differs": "TVP280",
             "weight_decay_on_norms": "TVP280"}


@pytest.mark.parametrize("path", PLANS, ids=rel)
def test_plan_lints_clean(path: Path) -> None:
    diagnostics = lint_file(path, project_root=ROOT)
    if path.parent.name == "bugs" and path.stem in LINT_BUGS:
        line = int(BUG_HEADER.match(path.read_text().splitlines()[0]).group(1))
        assert [(d.code.id, d.span.line) for d in diagnostics] == [(LINT_BUGS[path.stem], line)]
        return
    assert not diagnostics, describe(diagnostics)


@pytest.mark.parametrize("path", PLANS + FRAGMENTS, ids=rel)
def test_in_canonical_form(path: Path) -> None:
    text = path.read_text()
    assert format_source(text, rel(path)).text == text


@pytest.mark.parametrize("path", FRAGMENTS, ids=rel)
def test_fragment_lints_clean_when_used(path: Path, tmp_path: Path) -> None:
    main = tmp_path / "uses_fragment.tvp"
    main.write_text(f'plan uses_fragment\nmesh dp=2, tp=2, ep=2\nuse "{rel(path)}"\n')
    diagnostics = lint_file(main, project_root=ROOT)
    assert not diagnostics, describe(diagnostics)


@pytest.mark.parametrize("path", FRAGMENTS, ids=rel)
def test_fragment_holds_only_templates(path: Path) -> None:
    statements = parse_file(path).plan_file.statements
    kinds = {type(s) for s in statements}
    assert kinds <= {ast.TemplateDef, ast.UseDecl}
    assert ast.TemplateDef in kinds


# ---------------------------------------------------------------- the plans' content


def template_names() -> set[str]:
    names = set()
    for path in FRAGMENTS:
        for statement in parse_file(path).plan_file.statements:
            if isinstance(statement, ast.TemplateDef):
                names.add(statement.name.name)
    return names


def origins(plan: Plan):
    items = [*plan.layouts, *plan.collectives, *plan.algorithms, *plan.sends]
    for item in items:
        yield from getattr(item, "origins", ())
        if hasattr(item, "origin"):
            yield item.origin
    if plan.optimizer is not None:
        yield plan.optimizer.origin


def applied_templates() -> set[str]:
    names = set()
    for path in PLANS:
        for origin in origins(resolved(path)):
            names.update(site.name for site in origin.trail if site.kind == "apply")
    return names


def test_every_template_is_used_by_a_plan() -> None:
    defined, applied = template_names(), applied_templates()
    assert set(UNUSED_TEMPLATES) <= defined
    assert applied <= defined
    assert defined - applied == set(UNUSED_TEMPLATES), "update UNUSED_TEMPLATES"


@pytest.mark.parametrize("name", sorted(PAPER_MESHES))
def test_paper_configuration(name: str) -> None:
    plan = resolved(ROOT / "plans" / f"{name}.tvp")
    sizes = {axis.name: axis.size for axis in plan.mesh.axes}
    expected = PAPER_MESHES[name]
    data_parallel = sizes.get("dp", 1) * sizes.get("ep", 1)
    assert data_parallel == expected["dp"]
    assert sizes.get("tp", 1) == expected.get("tp", 1)
    assert sizes.get("pp", 1) == expected.get("pp", 1)
    assert plan.microbatches == PAPER_MICROBATCHES[name]
    samples, remainder = divmod(plan.spec.batch, data_parallel * plan.microbatches)
    assert samples >= 1 and remainder == 0


# ---------------------------------------------------------------- names exist in the spec


@cache
def model_parameters(model: str, config: str, settings: tuple = ()) -> tuple[str, ...]:
    """The parameter names of the spec model, built on the meta device."""
    return tuple(name for name, _ in build_model(model, config, settings).named_parameters())


@cache
def model_paths(model: str, config: str, settings: tuple = ()) -> frozenset[str]:
    """Every addressable name of the spec model: parameters, modules, module boundaries
    (``.in``/``.out``), inputs, ``loss``, and the gradients of all of them."""
    spec = build_model(model, config, settings)
    names = set(model_parameters(model, config, settings))
    for name, _ in spec.named_modules():
        if name:
            names |= {name, f"{name}.in", f"{name}.out"}
    names |= set(spec.input_specs(1, 1)) | {"loss"}
    return frozenset(names | {f"grad({name})" for name in names})


@cache
def build_model(model: str, config: str, settings: tuple = ()):
    """The spec model on the meta device; ``settings`` are the spec line's config overrides."""
    torch = pytest.importorskip("torch")
    from stdlib.models.common import read_configs

    file, cls_name = model.split(":")
    module = __import__(file.removesuffix(".py").replace("/", "."), fromlist=[cls_name])
    overrides = {"max_seq_len": 16} if "max_seq_len" in read_configs()[config] else {}
    overrides |= {key: int(value) if isinstance(value, Fraction) else value
                  for key, value in settings if key not in ("config", "batch", "seq")}
    with torch.device("meta"):
        return getattr(module, cls_name).from_config_name(config, **overrides)


def targets(plan: Plan):
    for layout in plan.layouts:
        yield layout.target, False
    for item in [*plan.collectives, *plan.sends]:
        yield item.target, False
    for algorithm in plan.algorithms:
        for target in algorithm.targets:
            yield target, False
    for stage in plan.stages:
        for member in stage.members:
            yield member, True


def dangling(plan: Plan) -> list[str]:
    paths = model_paths(plan.spec.model, plan.spec.config, plan.spec.settings)
    found = []
    for pattern, prefix in targets(plan):
        if not any(pattern.matches(path, prefix=prefix) for path in paths):
            found.append(str(pattern))
    return found


@pytest.mark.parametrize("path", PLANS, ids=rel)
def test_every_name_exists_in_the_spec(path: Path) -> None:
    assert not dangling(resolved(path))


def test_name_check_catches_a_typo(tmp_path: Path) -> None:
    text = QUICK_START.read_text().replace("(l.feed_forward, tp)", "(l.feed_froward, tp)")
    assert text != QUICK_START.read_text()
    broken = tmp_path / "typo.tvp"
    broken.write_text(text)
    plan = resolve_file(broken, project_root=ROOT).plan
    assert plan is not None
    assert any("feed_froward" in name for name in dangling(plan))


# ---------------------------------------------------------------- bug plans


def statements(path: Path) -> list[str]:
    """Statement lines, without comments, blank lines and the plan header."""
    lines = [line.split("#")[0].rstrip() for line in path.read_text().splitlines()]
    return [line for line in lines if line.strip() and not line.startswith("plan ")]


@pytest.mark.parametrize("path", BUG_PLANS, ids=rel)
def test_bug_plan_names_its_faulty_line(path: Path) -> None:
    lines = path.read_text().splitlines()
    header = BUG_HEADER.match(lines[0])
    assert header, "first line must be '# bug: <what> (line N).'"
    number = int(header.group(1))
    statement, mark, what = lines[number - 1].partition("# BUG: ")
    assert mark and what.strip(), f"line {number} must carry '# BUG: <what is wrong>'"
    faulty = statement.strip()
    assert faulty and not faulty.startswith("#")
    assert f"`{faulty}`" in " ".join(line.lstrip("# ") for line in lines[1:6])


@pytest.mark.parametrize("path", BUG_PLANS, ids=rel)
def test_bug_plan_differs_from_its_twin_only_at_the_faulty_line(path: Path) -> None:
    lines = path.read_text().splitlines()
    twin_name = next(m.group(1) for line in lines if (m := TWIN_LINE.match(line)))
    twin = ROOT / "plans" / f"{twin_name}.tvp"
    assert twin.is_file() and "bugs" not in twin_name
    buggy, correct = statements(path), statements(twin)
    only_buggy = [line for line in buggy if line not in correct]
    only_correct = [line for line in correct if line not in buggy]
    # one statement added, removed or changed; or two changed (a bug that needs a second
    # line to stay a valid plan, the faulty one first)
    assert 1 <= len(only_buggy) + len(only_correct) <= 2 or \
        len(only_buggy) == len(only_correct) == 2
    faulty = lines[int(BUG_HEADER.match(lines[0]).group(1)) - 1].split("#")[0].rstrip()
    if "missing after line" in lines[0]:
        assert not only_buggy and len(only_correct) == 1
        assert faulty in buggy
    else:
        assert only_buggy[0] == faulty


# ---------------------------------------------------------------- gradient synchronisation


def batch_axes(plan: Plan) -> tuple[str, ...]:
    """The mesh axes splitting the batch dimension of the first model input."""
    for name in ("tokens", "x"):
        layout = plan.layout_of(name)
        if layout is not None:
            return layout.axes_of_dim(0)
    return ()


def split_axes(plan: Plan, parameter: str) -> set[str]:
    return {axis for layout in plan.layouts_for(parameter)
            for axis, placement in layout.placements if isinstance(placement, Shard)}


def reduced_axes(plan: Plan, parameter: str) -> list[str]:
    """Axes of every gradient all-reduce / reduce-scatter that applies to ``parameter``."""
    grad = f"grad({parameter})"
    return [axis for c in plan.collectives
            if c.kind in ("all-reduce", "reduce-scatter") and c.target.matches(grad)
            for axis in c.axes]


def sync_problems(plan: Plan) -> list[str]:
    """Parameters whose gradient is not reduced exactly once over every batch axis (axes that
    split the parameter itself, as ep splits the experts, must not reduce it)."""
    problems = []
    for name in model_parameters(plan.spec.model, plan.spec.config, plan.spec.settings):
        split, reduced = split_axes(plan, name), reduced_axes(plan, name)
        for axis in batch_axes(plan):
            expected = 0 if axis in split else 1
            if reduced.count(axis) != expected:
                problems.append(f"grad({name}) reduced {reduced.count(axis)}x over {axis}")
    return problems


@pytest.mark.parametrize("path", [p for p in PLANS if p.parent.name != "bugs"], ids=rel)
def test_every_gradient_is_synchronised_once_over_the_batch_axes(path: Path) -> None:
    assert not sync_problems(resolved(path))


def test_sync_check_catches_expert_grads_over_the_wrong_group() -> None:
    problems = sync_problems(resolved(ROOT / "plans" / "bugs" / "expert_grads_wrong_group.tvp"))
    assert problems and all("experts" in p and "over ep" in p for p in problems)


def test_examples_doc_quotes_the_bug_plans_first_lines() -> None:
    doc = (ROOT / "docs" / "examples.md").read_text().splitlines()
    quoted = [line for line in doc if line.startswith("# bug: ")]
    first_lines = {path.read_text().splitlines()[0] for path in BUG_PLANS}
    assert quoted and set(quoted) <= first_lines


# ---------------------------------------------------------------- ZeRO-1 blocks


def zero_problems(plan: Plan) -> list[str]:
    """docs/semantics.md Rule 6.1: under `optimizer ... shard over A` every parameter's local
    dimension 0 must be divisible by the size of A, and no axis of A may already shard it."""
    if plan.optimizer is None or not plan.optimizer.shard_axes:
        return []
    shard = plan.optimizer.shard_axes
    spec = build_model(plan.spec.model, plan.spec.config, plan.spec.settings)
    problems = []
    for name, parameter in spec.named_parameters():
        layouts = plan.layouts_for(name)
        local = parameter.shape[0] // plan.mesh.group_size(
            [axis for layout in layouts for axis in layout.axes_of_dim(0)])
        if local % plan.mesh.group_size(shard) or set(shard) & split_axes(plan, name):
            problems.append(f"{name}: local dim 0 {local} over {'x'.join(shard)}")
    return problems


@pytest.mark.parametrize("path", [p for p in PLANS if "shard over" in p.read_text()
                                  or "zero1_adamw" in p.read_text()], ids=rel)
def test_zero1_blocks_divide(path: Path) -> None:
    assert not zero_problems(resolved(path))


def test_zero1_check_catches_an_indivisible_block(tmp_path: Path) -> None:
    text = (ROOT / "plans" / "llama3_405b.tvp").read_text()
    broken = tmp_path / "zero.tvp"
    broken.write_text(text.replace("weight-decay=0.1\n", "weight-decay=0.1 shard over dp\n"))
    problems = zero_problems(resolve_file(broken, project_root=ROOT).plan)
    assert "embed.weight: local dim 0 16032 over dp" in problems
