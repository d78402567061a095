"""The solver: what normalisation leaves undecided, proven with z3 over the reals.

The only module of the project that imports z3. An obligation ``got == want`` (two terms of
``check/terms.py`` whose normal forms differ) is translated with sharing (each distinct
sub-term once), in a fresh context per call: variables are reals; ``App`` terms are
uninterpreted functions ``R^n -> R`` (the same symbol on both sides, so congruence is their
only property); ``max``/``min`` and ``cond ? a : b`` are ``If``; a negative exponent divides
(z3's division is total: a divisor that may be zero only weakens what can be proven). The
solver is asked whether ``got != want`` has a model: ``unsat`` proves the obligation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainverify_dsl.check import terms as t


@dataclass(frozen=True, slots=True)
class Outcome:
    #: ``proven``, ``refuted`` (a model under uninterpreted functions) or ``unknown``
    status: str
    reason: str = ""
    #: variable name -> value, for a refutation
    model: tuple[tuple[str, float], ...] = ()


class _Encoder:
    def __init__(self, z3: Any, ctx: Any) -> None:
        self.z3, self.ctx = z3, ctx
        self.memo: dict[int, Any] = {}
        self.vars: dict[str, Any] = {}
        self.functions: dict[tuple[str, int], Any] = {}

    def real(self, value: Any) -> Any:
        return self.z3.RealVal(f"{value.numerator}/{value.denominator}", self.ctx)

    def encode(self, term: Any) -> Any:
        z3 = self.z3
        if isinstance(term, bool):
            return z3.BoolVal(term, self.ctx)
        if isinstance(term, t.Inf):
            raise ValueError("an infinite value cannot be encoded")
        key = id(term)
        if key in self.memo:
            return self.memo[key]
        if isinstance(term, t.Poly):
            parts = [self.real(c) * self.encode(m) if c != 1 else self.encode(m)
                     for m, c in term.terms.items()]
            if term.const or not parts:
                parts.append(self.real(term.const))
            out = parts[0] if len(parts) == 1 else z3.Sum(parts)
        elif isinstance(term, t.Monomial):
            num = [self._power(f, e) for f, e in term.powers.items() if e > 0]
            den = [self._power(f, -e) for f, e in term.powers.items() if e < 0]
            top = num[0] if len(num) == 1 else z3.Product(num) if num else self.real(t._ONE)
            out = top if not den else top / (den[0] if len(den) == 1 else z3.Product(den))
        elif isinstance(term, t.Var):
            out = self.vars.get(term.name)
            if out is None:
                out = self.vars[term.name] = z3.Real(term.name, self.ctx)
        elif isinstance(term, t.App):
            sig = (term.fn, len(term.args))
            fn = self.functions.get(sig)
            if fn is None:
                sorts = [z3.RealSort(self.ctx)] * (len(term.args) + 1)
                fn = self.functions[sig] = z3.Function(f"{term.fn}/{len(term.args)}", *sorts)
            out = fn(*(self.encode(a) for a in term.args))
        elif isinstance(term, t.Lattice):
            args = sorted(term.args, key=lambda a: a.skey)
            out = self.encode(args[0])
            for a in args[1:]:
                x = self.encode(a)
                out = z3.If(x > out, x, out) if term.kind == "max" else z3.If(x < out, x, out)
        elif isinstance(term, t.Cmp):
            p = self.encode(term.poly)
            zero = self.real(t._ZERO)
            out = p > zero if term.op == ">" else p >= zero if term.op == ">=" else p == zero
        elif isinstance(term, t.BoolOp):
            args = [self.encode(a) for a in term.args]
            out = z3.Not(args[0]) if term.op == "not" else \
                z3.And(args) if term.op == "and" else z3.Or(args)
        elif isinstance(term, t.Ite):
            out = z3.If(self.encode(term.cond), self.encode(term.then), self.encode(term.other))
        else:
            raise TypeError(f"cannot encode {term!r}")
        self.memo[key] = out
        return out

    def _power(self, factor: Any, e: int) -> Any:
        base = self.encode(factor)
        if e == 1:
            return base
        return self.z3.Product([base] * e)


def prove_equal(got: Any, want: Any, timeout_s: float) -> Outcome:
    """Whether ``got == want`` for every real value of the variables and every function for
    the uninterpreted symbols."""
    import z3

    if isinstance(got, t.Inf) or isinstance(want, t.Inf):
        same = isinstance(got, t.Inf) and isinstance(want, t.Inf) and got.sign == want.sign
        return Outcome("proven" if same else "refuted", "an infinite value on one side")
    ctx = z3.Context()
    encoder = _Encoder(z3, ctx)
    solver = z3.Solver(ctx=ctx)
    solver.set("timeout", max(1, int(timeout_s * 1000)))
    solver.add(encoder.encode(got) != encoder.encode(want))
    result = solver.check()
    if result == z3.unsat:
        return Outcome("proven")
    if result == z3.sat:
        model = solver.model()
        values = []
        for name, v in encoder.vars.items():
            value = model.evaluate(v, model_completion=True)
            values.append((name, _as_float(value)))
        return Outcome("refuted", "the solver found values where the two sides differ",
                       tuple(values))
    return Outcome("unknown", f"z3: {solver.reason_unknown() or 'unknown'}")


def _as_float(value: Any) -> float:
    try:
        return float(value.as_fraction())
    except Exception:  # an algebraic number
        return float(value.approx(20).as_fraction())
