"""The plan's optimizer against the reference step's (``spec-optimizer``), before any run.

Every hyper-parameter is compared with the defaults filled in (``vocab.OPTIMIZER_DEFAULTS``,
torch.optim's), so ``adamw lr=3e-4`` and ``adamw lr=3e-4 weight-decay=0.01`` are the same
recipe. A difference is an error at the ``optimizer`` line: the simulation would show it as
different updates, and no proof can hold. So is a ``spec-optimizer`` the plan implements with
no ``optimizer`` statement (reported at the ``spec-optimizer``). An ``optimizer`` with no
``spec-optimizer`` is well formed; ``tvp simulate`` refuses to call it agreeing (its update is
compared with nothing).
"""

from __future__ import annotations

from fractions import Fraction

from trainverify_dsl.plan import messages, vocab
from trainverify_dsl.plan.model import Optimizer, OptionValue, ParamGroup, Plan
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Diagnostic


def _exact(value: OptionValue | float) -> object:
    if isinstance(value, tuple):
        return tuple(_exact(v) for v in value)
    return Fraction(value) if isinstance(value, (int, float, Fraction)) else value


def filled(opt: Optimizer) -> dict[str, object]:
    """Every hyper-parameter of ``opt`` with its value, defaults filled in, exact."""
    values = {k: _exact(v) for k, v in vocab.OPTIMIZER_DEFAULTS.get(opt.kind, {}).items()}
    values.update({k: _exact(v) for k, v in opt.hyper})
    return values


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    if isinstance(value, Fraction):
        if value.denominator == 1:
            return str(value.numerator)
        shown = repr(float(value))  # the shortest float that reads back as itself
        if Fraction(shown) == value:
            return shown
        # no float holds it (1e-1000 is 0.0 as a float; two values apart past float
        # precision would print alike): exactly, or says how it is rounded
        if len(str(value.numerator)) + len(str(value.denominator)) <= 24:
            return f"{value.numerator}/{value.denominator}"
        if float(value) == 0:
            return "a number too small for a float, but not 0"
        return f"{float(value):.17g} (rounded)"
    return str(value)


def recipe_problems(plan: Plan, *, unread_statements: bool = False) -> list[Diagnostic]:
    """``unread_statements``: the file has statements the parser could not read (one of them
    may be the missing ``optimizer``)."""
    return _optimizer_problems(plan, unread_statements) + _group_problems(plan) + \
        _clip_problems(plan)


def _clip_problems(plan: Plan) -> list[Diagnostic]:
    """The plan's ``clip-grad-norm`` against the recipe's ``clip-grad-norm=`` (§6.3)."""
    mine, ref = plan.clip_grad_norm, plan.spec_optimizer
    if ref is None or (mine is None and ref.clip is None):
        return []
    related = ((ref.origin.report_span, "the spec's optimizer"),)
    if mine is None:
        where = plan.optimizer.origin if plan.optimizer else ref.origin
        return [messages.at(codes.OPTIMIZER_DIFFERS, "the spec's recipe clips gradients at norm "
                            f"{_show(ref.clip)}, the plan does not clip", where,
                            related=related, help=f"add 'clip-grad-norm {_show(ref.clip)}'")]
    if ref.clip is None:
        return [messages.at(codes.OPTIMIZER_DIFFERS, "the plan clips gradients at norm "
                            f"{_show(mine.max_norm)}, the spec's recipe does not clip",
                            mine.origin, related=related,
                            help="remove the statement, or state the reference's clipping: "
                                 f"'spec-optimizer ... clip-grad-norm={_show(mine.max_norm)}'")]
    if mine.max_norm != ref.clip:
        return [messages.at(codes.OPTIMIZER_DIFFERS, "the plan clips gradients at norm "
                            f"{_show(mine.max_norm)}, the spec's recipe at {_show(ref.clip)}",
                            mine.origin, related=related)]
    return []


def _optimizer_problems(plan: Plan, unread_statements: bool) -> list[Diagnostic]:
    mine, ref = plan.optimizer, plan.spec_optimizer
    if mine is None and ref is not None and not unread_statements:
        hyper = " ".join(f"{k}={_show(v)}" for k, v in ref.hyper)
        return [messages.at(codes.OPTIMIZER_DIFFERS, f"the spec's step updates the parameters "
                            f"with {ref.kind}, but the plan has no `optimizer` statement",
                            ref.origin, help=f"add `optimizer {ref.kind} {hyper}`".rstrip())]
    if mine is None:
        return []
    if ref is None:
        return []  # no reference: `tvp simulate` reports the update unchecked
    if mine.kind != ref.kind:
        return [messages.at(codes.OPTIMIZER_DIFFERS, f"the plan's optimizer is {mine.kind}, the "
                            f"spec's is {ref.kind}", mine.origin,
                            related=((ref.origin.report_span, "the spec's optimizer"),))]
    a, b = filled(mine), filled(ref)
    if set(a) != set(b) or None in a.values() or None in b.values():
        return []  # a missing or invalid value (lr=1e400) has its own error at the option
    differ = [k for k in sorted(a) if a[k] != b[k]]
    if not differ:
        return []
    what = ", ".join(f"{k}={_show(a.get(k))} (spec: {_show(b.get(k))})" for k in differ)
    return [messages.at(codes.OPTIMIZER_DIFFERS, f"the plan's {mine.kind} differs from the "
                        f"spec's: {what}", mine.origin,
                        related=((ref.origin.report_span, "the spec's optimizer"),))]


def _group_problems(plan: Plan) -> list[Diagnostic]:
    """Parameter groups (§6.5) that differ where the text alone shows it: a group of one side
    against the other side's group with the same targets, or against the other side's
    plan-wide statement when that side has no groups. Other regroupings are compared
    parameter by parameter once the model is known (``tvp simulate``, ``tvp check``)."""
    mine, ref = plan.optimizer, plan.spec_optimizer
    if mine is None or ref is None or mine.kind != ref.kind:
        return []
    ours = {_targets(g): g for g in plan.param_groups}
    theirs = {_targets(g): g for g in plan.spec_param_groups}
    found: list[Diagnostic] = []
    for key in [*ours, *(k for k in theirs if k not in ours)]:
        a, b = ours.get(key), theirs.get(key)
        if a is None and plan.param_groups or b is None and plan.spec_param_groups:
            continue
        left = a.optimizer if a is not None else mine
        right = b.optimizer if b is not None else ref
        x, y = filled(left), filled(right)
        if set(x) != set(y) or None in x.values() or None in y.values():
            continue
        differ = [k for k in sorted(x) if x[k] != y[k]]
        if not differ:
            continue
        what = ", ".join(f"{k}={_show(x.get(k))} (spec: {_show(y.get(k))})" for k in differ)
        if a is None:
            assert b is not None
            stated = " ".join(f"{k}={_show(v)}" for k, v in b.given)
            found.append(messages.at(
                codes.OPTIMIZER_DIFFERS, f"the plan updates {key} with its optimizer, the "
                f"spec's recipe with a group of its own: {what}", mine.origin,
                related=((b.origin.report_span, "the spec's parameter group"),),
                help=f"add `on {key}: optimizer {mine.kind} {stated}`".rstrip()))
            continue
        where = "the spec's parameter group" if b is not None else "the spec's optimizer"
        found.append(messages.at(
            codes.OPTIMIZER_DIFFERS, f"the plan's group for {key} differs from the spec's "
            f"recipe for it: {what}", a.origin,
            related=(((b or ref).origin.report_span, where),)))
    return found


def _targets(group: ParamGroup) -> str:
    return ", ".join(str(t) for t in group.targets)
