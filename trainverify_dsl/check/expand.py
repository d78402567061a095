"""Equality by expansion: a canonical form for the obligations normalisation left open.

The normal form of ``check/terms.py`` keeps products of sums factored, so ``m*(a+b)`` and
``m*a + m*b`` are different terms (a partial sum multiplied before its all-reduce). Here a
term is expanded into a sum of monomials over *atoms*, fully: every product of sums is
multiplied out. Atoms are variables, applications, max/min, choices and negative powers of
sums; an atom's arguments are expanded too and the atom is keyed by them, so two
applications of the same function to arguments that expand to the same sum are one atom
(congruence). The expansion of a term is therefore canonical for commutative-ring identities
with uninterpreted functions: equal expansions are a proof (the rewrites are identities of
real arithmetic, divisors non-zero).

Expansion can grow exponentially, and the two sides of an obligation usually share almost
everything (hash-consing makes shared sub-terms the same object). So ``Expander.equal``
first cancels what the two sides share (``a - b`` in normal form), then expands the
difference to increasing *depths*: at depth ``k`` a sum nested deeper than ``k`` factors is
an atom of its own, keyed by identity (the same object is the same value), and so are the
arguments of deeper atoms; up to depth ``depths`` only short sums (at most ``small`` terms)
are multiplied out, long ones (a cotangent both sides share) stay atoms. Then
``one_sided_equal`` multiplies out every sum, whatever its length, that only one side holds,
each sub-term both sides hold staying one atom by identity (a factored ``x * (p + q)``
against spread ``x*p + x*q``, with ``x`` a large shared cotangent). The last depth multiplies
out everything. The difference expanding to zero at any depth, or the two sides' one-sided
expansions being equal, is a proof; a budget of monomials bounds each (``None``: undecided,
the obligation goes to the solver or stays open).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from trainverify_dsl.check import terms as t

#: monomial (atom id, exponent) -> coefficient: an ``int`` when whole (most are; int
#: arithmetic is many times faster than ``Fraction``'s), else a ``Fraction``. The two are
#: equal and hash alike when equal, so expansions compare as exact values either way.
Expanded = dict[tuple[tuple[int, int], ...], int | Fraction]


def _whole(c: Any) -> int | Fraction:
    """A term's coefficient as an ``int`` when it is one."""
    return c.numerator if type(c) is Fraction and c.denominator == 1 else c


class TooLarge(Exception):
    """The expansion exceeds the budget."""


#: ``stepwise_zero`` stops after this many rounds, or once it made this many new terms (its
#: terms are interned in the proof's table, which they then share with the step: bounded so
#: that undecided obligations do not fill it)
STEPWISE_ROUNDS = 64
STEPWISE_TERMS = 20_000
#: ... or once a round holds more terms than this: a difference that cancels stays small (102
#: terms at most in ``deepseek_tiny_tp``), and one that does not would burn the whole budget
#: on every obligation a wrong plan leaves open (the symbolic proof of a bug plan: 70 s
#: against 12 s without this expansion, before it stopped here)
STEPWISE_SIZE = 2_000


def stepwise_zero(difference: t.Poly, budget: int) -> bool:
    """Whether ``difference`` (a normal form) is zero, shown by multiplying out one sum factor
    of each term per round and adding the terms again in normal form, so that whatever
    cancels at one level is gone before the next is multiplied out. Session 28: a plan that
    sums partial cotangents a rank multiplied by ``sin`` one by one (two-term sums distribute)
    against a reference that multiplies the whole four-term sum (it stays a factor) differs
    four sums deep; the expansions by depth multiply out every sum at a depth at once, shared
    or not, and outgrew any budget, where this cancels down to zero through at most 102 terms.
    Every step is an identity (a product distributed over a sum), so zero is a proof; ``False``
    is no answer (a term count over ``budget``, no sum factor left, the rounds spent, or
    ``STEPWISE_TERMS`` new terms made, or the table too full to make them)."""
    start = len(t._TABLE)
    if start + STEPWISE_TERMS > t.MAX_TERMS:
        return False
    try:
        return _stepwise(difference, budget, start)
    except t.TooManyTerms:
        return False
    finally:
        # its terms are scratch: forgotten (once ``_stepwise``'s frame let go of them), not
        # left to fill the proof's table
        t.forget_since(start)


def _stepwise(d: t.Poly, budget: int, start: int) -> bool:
    for _ in range(STEPWISE_ROUNDS):
        if not d.terms:
            return not d.const
        if len(d.terms) > min(budget, STEPWISE_SIZE) or \
                len(t._TABLE) - start > STEPWISE_TERMS:
            return False
        d = _without_common_factors(d)
        parts: list[t.Poly] = []
        changed = False
        for m, c in d.terms.items():
            # the shortest sum first: a long one both sides share is multiplied out last
            factor = min((f for f, e in m.powers.items() if e > 0 and isinstance(f, t.Poly)),
                         key=lambda f: len(f.terms), default=None)
            if factor is None:
                parts.append(t.Poly.make(t._ZERO, {m: c}))
                continue
            changed = True
            rest = dict(m.powers)
            rest[factor] -= 1
            if not rest[factor]:
                del rest[factor]
            if rest:
                parts.append(t._times_sum(t.Poly.make(t._ZERO, {t.Monomial.make(rest): c}),
                                          factor))
            else:
                parts.append(factor._scaled(c))
        if not changed:
            return False
        d = t.Poly.sum(parts)
        t.check_deadline()
    return False


def _without_common_factors(d: t.Poly) -> t.Poly:
    """``d`` divided by the factors every term holds (each at its least positive exponent):
    zero exactly when ``d`` is, for a zero test, and never multiplied out."""
    if d.const or len(d.terms) < 2:
        return d
    common: dict[Any, int] | None = None
    for m in d.terms:
        mine = {f: e for f, e in m.powers.items() if e > 0}
        common = mine if common is None else \
            {f: min(e, mine[f]) for f, e in common.items() if f in mine}
        if not common:
            return d
    assert common is not None
    out: dict[t.Monomial, Any] = {}
    for m, c in d.terms.items():
        powers = {f: e - common.get(f, 0) for f, e in m.powers.items()}
        powers = {f: e for f, e in powers.items() if e}
        if not powers:
            return d  # a term that is the common factor itself: keep d as it is
        out[t.Monomial.make(powers)] = c
    return t.Poly.make(t._ZERO, out)


class Expander:
    def __init__(self, budget: int = 20_000, depths: int = 8, small: int = 6) -> None:
        self.budget, self.depths, self.small = budget, depths, small
        self.memo: dict[tuple[int, int], Expanded] = {}
        self.atoms: dict[Any, int] = {}
        #: keeps memoised terms alive, so their ids are not reused
        self._alive: list[Any] = []
        #: the last obligation was decided by ``one_sided_equal``: the next one (most often
        #: the next element of the same tensor) tries it first
        self._one_sided_first = False

    def equal(self, a: Any, b: Any) -> bool | None:
        """``True`` when ``a - b`` expands to zero at some depth (a proof); ``None`` when no
        depth within the budget shows it (undecided: not a proof of difference)."""
        if isinstance(a, (bool, t.Cmp, t.BoolOp)) or isinstance(b, (bool, t.Cmp, t.BoolOp)):
            return True if a is b else None
        if isinstance(a, t.Inf) or isinstance(b, t.Inf):
            return True if a is b else None
        difference = a - b
        self._alive.append(difference)
        if stepwise_zero(difference, self.budget):
            return True
        if self._one_sided_first and self._one_sided(a, b):
            return True
        # first multiply out only short sums (``1 - s``), the long ones (a shared cotangent)
        # staying atoms by identity; then every sum only one side has; then every sum
        for depth in range(1, self.depths + 1):
            try:
                if not self.expand(difference, depth):
                    self._one_sided_first = False
                    return True
            except TooLarge:
                return None
        if not self._one_sided_first and self._one_sided(a, b):
            self._one_sided_first = True
            return True
        self._one_sided_first = False
        try:
            return True if not self.expand(difference, self.depths + 1) else None
        except TooLarge:
            return None

    def _one_sided(self, a: Any, b: Any) -> bool:
        try:
            return one_sided_equal(a, b, self.budget)
        except TooLarge:
            return False

    def _key_of(self, term: Any, depth: int) -> Any:
        if depth < 0 or isinstance(term, (t.Cmp, t.BoolOp)):
            return ("id", id(term)) if depth < 0 else ("atom", self._atom(term, depth))
        if isinstance(term, t.Inf):
            return ("inf", term.sign)
        return frozenset(self.expand(term, depth).items())

    def expand(self, term: Any, depth: int) -> Expanded:
        key = (id(term), depth)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        t.check_deadline()
        if isinstance(term, t.Poly):
            out: Expanded = {(): _whole(term.const)} if term.const else {}
            for m, c in term.terms.items():
                _add(out, self.expand(m, depth), _whole(c))
        elif isinstance(term, t.Monomial):
            out = {(): 1}
            for f, e in term.powers.items():
                if e > 0 and isinstance(f, t.Poly) and depth > 0 and \
                        (len(f.terms) <= self.small or depth > self.depths):
                    for _ in range(e):
                        out = self._multiply(out, self.expand(f, depth - 1))
                else:
                    out = self._multiply(out, {((self._atom(f, depth - 1), e),): 1})
        else:
            out = {((self._atom(term, depth - 1), 1),): 1}
        if len(out) > self.budget:
            raise TooLarge
        self.memo[key] = out
        self._alive.append(term)
        return out

    def _multiply(self, x: Expanded, y: Expanded) -> Expanded:
        return _product(x, y, self.budget)

    def _atom(self, f: Any, depth: int) -> int:
        """The id of an atom: by identity below depth 0, else keyed by its kind and its
        arguments' expansions to ``depth``."""
        if isinstance(f, t.Var):
            key: Any = ("var", f.name)
        elif depth < 0:
            key = ("id", id(f))
            self._alive.append(f)
        elif isinstance(f, t.App):
            key = ("app", f.fn, tuple(self._key_of(a, depth) for a in f.args))
        elif isinstance(f, t.Lattice):
            key = ("lattice", f.kind, frozenset(self._key_of(a, depth) for a in f.args))
        elif isinstance(f, t.Ite):
            key = ("ite", self._key_of(f.cond, depth), self._key_of(f.then, depth),
                   self._key_of(f.other, depth))
        elif isinstance(f, t.Cmp):
            key = ("cmp", f.op, self._key_of(f.poly, depth))
        elif isinstance(f, t.BoolOp):
            key = ("bool", f.op, frozenset(self._key_of(a, depth) for a in f.args))
        elif isinstance(f, t.Poly):  # a sum with a negative exponent: keyed by its expansion
            key = ("sum", self._key_of(f, depth))
        else:
            raise TypeError(f"not a term: {f!r}")
        atom = self.atoms.get(key)
        if atom is None:
            atom = self.atoms[key] = len(self.atoms)
        return atom


def _product(x: Expanded, y: Expanded, budget: int) -> Expanded:
    """``x * y`` multiplied out; ``TooLarge`` past ``budget`` monomials."""
    if len(x) * len(y) > budget * 4:
        raise TooLarge
    t.check_deadline()
    if len(x) == 1 or len(y) == 1:  # times one monomial: distinct monomials stay distinct
        (one, k), = (x if len(x) == 1 else y).items()
        many = y if len(x) == 1 else x
        if not one:  # (expansions are never mutated once made: sharing one is safe)
            return many if k == 1 else {m: c * k for m, c in many.items()}
        return {_merge(m, one): c * k for m, c in many.items()}
    out: Expanded = {}
    get, pop = out.get, out.pop
    for mx, cx in x.items():
        for my, cy in y.items():
            m = _merge(mx, my)
            c = get(m, 0) + cx * cy
            if c:
                out[m] = c
            else:
                pop(m, None)
    if len(out) > budget:
        raise TooLarge
    return out


def _add(out: Expanded, x: Expanded, k: int | Fraction) -> None:
    for m, c in x.items():
        v = out.get(m, 0) + c * k
        if v:
            out[m] = v
        else:
            out.pop(m, None)


def _merge(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
           ) -> tuple[tuple[int, int], ...]:
    if not a:
        return b
    if not b:
        return a
    if len(b) == 1 and len(a) == 1:
        (x, e), (y, f) = a[0], b[0]
        if x != y:
            return (a[0], b[0]) if x < y else (b[0], a[0])
        return ((x, e + f),) if e + f else ()
    powers = dict(a)
    for atom, e in b:
        n = powers.get(atom, 0) + e
        if n:
            powers[atom] = n
        else:
            del powers[atom]
    return tuple(sorted(powers.items()))


def _children(x: Any) -> tuple[Any, ...]:
    if isinstance(x, t.Poly):
        return tuple(x.terms)
    if isinstance(x, t.Monomial):
        return tuple(x.powers)
    if isinstance(x, (t.App, t.Lattice, t.BoolOp)):
        return tuple(x.args)
    if isinstance(x, t.Ite):
        return (x.cond, x.then, x.other)
    if isinstance(x, t.Cmp):
        return (x.poly,)
    return ()


def _reach(x: Any) -> set[int]:
    """The ids of every sub-term of ``x`` (``x`` included)."""
    seen: set[int] = set()
    stack = [x]
    while stack:
        y = stack.pop()
        if id(y) not in seen:
            seen.add(id(y))
            stack.extend(_children(y))
    return seen


def one_sided_equal(a: Any, b: Any, budget: int) -> bool:
    """``a == b`` by multiplying out every sum that only one side holds, each sub-term both
    sides hold staying one atom by identity (the same object is the same value). So a sum
    one side keeps as a factor (``x * (p + q)``) meets the other side's spread terms (``x*p +
    x*q``) whatever their lengths, while the large cotangents both sides share are not
    expanded. Raises ``TooLarge`` past ``budget`` monomials."""
    if not isinstance(a, t.Poly) or not isinstance(b, t.Poly):
        return False
    shared = _reach(a) & _reach(b)
    memo: dict[int, Expanded] = {}
    atoms: dict[Any, int] = {}

    def atom(f: Any) -> int:
        if isinstance(f, t.Var):
            key: Any = ("var", f.name)
        elif id(f) in shared or not isinstance(f, (t.App, t.Poly)):
            key = ("id", id(f))
        elif isinstance(f, t.App):
            key = ("app", f.fn, tuple(frozenset(expand(x).items()) for x in f.args))
        else:  # a sum with a negative exponent, keyed by its expansion
            key = ("sum", frozenset(expand(f).items()))
        return atoms.setdefault(key, len(atoms))

    def expand(x: Any) -> Expanded:
        hit = memo.get(id(x))
        if hit is not None:
            return hit
        t.check_deadline()
        if isinstance(x, t.Poly):
            out: Expanded = {(): _whole(x.const)} if x.const else {}
            for m, c in x.terms.items():
                _add(out, expand(m), _whole(c))
        elif isinstance(x, t.Monomial):
            out = {(): 1}
            for f, e in x.powers.items():
                if e > 0 and isinstance(f, t.Poly) and id(f) not in shared:
                    for _ in range(e):
                        out = _product(out, expand(f), budget)
                else:
                    out = _product(out, {((atom(f), e),): 1}, budget)
        else:
            out = {((atom(x), 1),): 1}
        if len(out) > budget:
            raise TooLarge
        memo[id(x)] = out
        return out

    return expand(a) == expand(b)
