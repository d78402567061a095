"""Exact symbolic values in a canonical form for the algebra parallel plans rearrange.

A real-valued scalar is a ``Poly``: a rational constant plus rational multiples of
``Monomial``s. A monomial is a product of *factors* with non-zero integer exponents (a
negative exponent divides). Factors are

- ``Var``: one element of an input tensor (a parameter, an activation, a state);
- ``App``: an uninterpreted function of polys (``exp``, ``log``, ``sqrt``, ``sigmoid``, ...:
  the same function on both sides, congruence its only property);
- ``Lattice``: ``max``/``min`` of a set of polys (associative, commutative, idempotent:
  nested ones flatten);
- ``Ite``: ``cond ? a : b`` with a symbolic condition (``Cmp``, ``BoolOp``);
- a ``Poly`` of two or more terms that is multiplied by something non-constant: it stays a
  factor (products are not expanded, so a value's size follows the computation, not its
  expansion), normalised to be *primitive* (its leading coefficient is 1; the content moves
  to the monomial's coefficient).

Every term is hash-consed (``_intern``): structurally equal terms are the same object, so
equality is ``is``. The normal form decides equality up to what parallel plans change:
re-association and re-ordering of sums (partial sums, all-reduce, gradient accumulation) and
of max/min (vocabulary-parallel softmax), constant factors moved through sums (averages,
loss scales, mean of means), and cancellation ``x * x**-1 = 1``. It does not expand products
of sums (``(a+b)*c`` stays factored while ``a*c + b*c`` is a sum): values equal only by
distributivity have different forms and go to the solver (``check/solver.py``).

Soundness (what the checker rests on): every rewrite here is an identity of real arithmetic
given that divisors are non-zero; ``tests/test_check_terms.py`` holds the normal form to a
direct float evaluation of the same expressions.
"""

from __future__ import annotations

import math
import sys
import time
import zlib
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

#: name -> interned term (cleared by ``reset``)
_TABLE: dict[Any, Any] = {}

#: The most distinct terms one proof may make (about 0.8 KiB each with the table's keys:
#: 4,000,000 stay under 4 GiB of memory): beyond it ``TooManyTerms`` (the step is too large
#: to prove as one stage; the verdict is inconclusive, not an exhausted machine).
MAX_TERMS = 4_000_000


class TooManyTerms(Exception):
    """More than ``MAX_TERMS`` distinct terms."""


class OutOfTime(Exception):
    """The proof's time limit (``set_deadline``) passed."""


#: ``time.perf_counter()`` after which a proof stops (``None``: no limit)
_DEADLINE: list[float | None] = [None]


def set_deadline(deadline: float | None) -> None:
    """Stop with ``OutOfTime`` once ``time.perf_counter()`` passes ``deadline``: checked as
    terms are made (``_full``) and by the symbolic domain at every op."""
    _DEADLINE[0] = deadline


def check_deadline() -> None:
    deadline = _DEADLINE[0]
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfTime("the proof reached its time limit")


def _full() -> None:
    if len(_TABLE) > MAX_TERMS:
        raise TooManyTerms(f"the symbolic step exceeds {MAX_TERMS:,} distinct terms")
    if len(_TABLE) % 4096 == 0:
        check_deadline()


def _intern(cls: type, key: Any, *fields: Any) -> Any:
    term = _TABLE.get(key)
    if term is None:
        _full()
        term = object.__new__(cls)
        term._init(*fields)
        _TABLE[key] = term
    return term


def _rational(value: Any) -> Fraction:
    """An exact rational for a Python/numpy number; a float is read as the simplest rational
    that rounds to it (``0.1`` is 1/10): the program meant that real number."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, (bool, int)) or (hasattr(value, "dtype") and value.dtype.kind in "biu"):
        return Fraction(int(value))
    x = float(value)
    if not math.isfinite(x):
        raise NonReal(f"the constant {x} is not a real number")
    exact = Fraction(x)
    simple = exact.limit_denominator(1 << 24)
    return simple if float(simple) == x else exact


class NonReal(ValueError):
    """A value with no meaning over the reals (an infinite constant, a division by zero)."""


# -- factors ---------------------------------------------------------------------------------


def _stable(text: str) -> int:
    """A hash of ``text`` that does not depend on ``PYTHONHASHSEED`` (so normal forms, and
    with them which obligations reach the solver, are the same on every run)."""
    return zlib.crc32(text.encode())


class Term:
    """Base of every interned term; ``skey`` is a structural hash (stable across runs), used
    to order terms canonically and to pick a poly's leading term."""

    __slots__ = ("skey",)


class Var(Term):
    __slots__ = ("name",)

    def _init(self, name: str) -> None:
        self.name = name
        self.skey = hash((1, _stable(name)))

    def __repr__(self) -> str:
        return self.name


def var(name: str) -> Poly:
    return Poly.of_factor(_intern(Var, ("var", name), name))


class App(Term):
    """An uninterpreted function applied to polys."""

    __slots__ = ("fn", "args")

    def _init(self, fn: str, args: tuple[Poly, ...]) -> None:
        self.fn, self.args = fn, args
        self.skey = hash((2, _stable(fn)) + tuple(a.skey for a in args))

    def __repr__(self) -> str:
        return f"{self.fn}({', '.join(map(repr, self.args))})"


def app(fn: str, *args: Poly) -> Poly:
    return Poly.of_factor(_intern(App, ("app", fn) + tuple(map(id, args)), fn, args))


def exp(p: Poly) -> Poly:
    """``exp`` with the two identities of the real function the checker uses (both listed
    in every verdict): ``exp(a + b) = exp(a) * exp(b)`` and ``exp(log x) = x`` (``log``'s
    argument positive). So ``exp(x - max) / sum(exp(x_j - max))`` and ``exp(log_softmax(x))``
    both become ``exp(x) / sum(exp(x_j))``: the max shift of a stable softmax cancels. An
    integer multiple ``exp(k*m)`` is ``exp(m)**k``."""
    result = ONE if not p.const else app("exp", Poly.constant(p.const))
    for m, c in p.terms.items():
        f = m.powers
        if c.denominator == 1:
            if len(f) == 1:
                (factor, e), = f.items()
                if isinstance(factor, App) and factor.fn == "log" and e == 1:
                    result = result * factor.args[0].power(int(c))
                    continue
            result = result * app("exp", Poly.make(_ZERO, {m: _ONE})).power(int(c))
        else:
            result = result * app("exp", Poly.make(_ZERO, {m: c}))
    return result


class Lattice(Term):
    """``max`` or ``min`` of two or more distinct polys."""

    __slots__ = ("kind", "args")

    def _init(self, kind: str, args: frozenset[Poly]) -> None:
        self.kind, self.args = kind, args
        self.skey = hash((3, _stable(kind), frozenset(a.skey for a in args)))

    def __repr__(self) -> str:
        return f"{self.kind}({', '.join(sorted(map(repr, self.args)))})"


def lattice(kind: str, values: Iterable[Any]) -> Any:
    """``max``/``min`` of ``values`` (nested ones of the same kind flattened, duplicates and
    constants below/above another constant dropped; ``-inf`` ignored by ``max``, ``inf`` by
    ``min``, the other infinity wins)."""
    args: set[Poly] = set()
    for v in values:
        if isinstance(v, Inf):
            if (v.sign > 0) == (kind == "max"):
                return v
            continue
        f = v.single_factor()
        if isinstance(f, Lattice) and f.kind == kind:
            args.update(f.args)
        else:
            args.add(v)
    consts = [a.const for a in args if a.is_const]
    if len(consts) > 1:
        keep = max(consts) if kind == "max" else min(consts)
        args = {a for a in args if not a.is_const} | {Poly.constant(keep)}
    if not args:
        return NEG_INF if kind == "max" else INF
    if len(args) == 1:
        return next(iter(args))
    frozen = frozenset(args)
    return Poly.of_factor(_intern(Lattice, (kind, frozen), kind, frozen))


class Cmp(Term):
    """The boolean ``poly OP 0`` with ``OP`` in ``> >= ==``; the poly is scaled so its
    leading coefficient is 1 (by a positive number for the inequalities)."""

    __slots__ = ("op", "poly")

    def _init(self, op: str, poly: Poly) -> None:
        self.op, self.poly = op, poly
        self.skey = hash((4, _stable(op), poly.skey))

    def __repr__(self) -> str:
        return f"({self.poly!r} {self.op} 0)"


class BoolOp(Term):
    """``not``, ``and``, ``or`` of symbolic booleans."""

    __slots__ = ("op", "args")

    def _init(self, op: str, args: Any) -> None:
        self.op, self.args = op, args
        self.skey = hash((5, _stable(op)) + tuple(sorted(a.skey for a in args)))

    def __repr__(self) -> str:
        return f"{self.op}({', '.join(map(repr, self.args))})"


Bool = Any  # a Python bool, a Cmp or a BoolOp


def compare(op: str, a: Poly, b: Poly) -> Bool:
    """``a OP b`` for ``OP`` in ``> >= < <= == !=``: a Python bool when the difference is a
    constant, else a symbolic boolean."""
    if op in ("<", "<="):
        return compare(">" if op == "<" else ">=", b, a)
    if op == "!=":
        return negate(compare("==", a, b))
    if isinstance(a, Inf) or isinstance(b, Inf):
        return _compare_inf(op, a, b)
    diff = a - b
    if diff.is_const:
        c = diff.const
        return bool(c > 0 if op == ">" else c >= 0 if op == ">=" else c == 0)
    lead = diff.lead_coefficient()
    scale = abs(lead) if op != "==" else lead
    poly = diff * Poly.constant(1 / scale)
    return _intern(Cmp, ("cmp", op, id(poly)), op, poly)


def _compare_inf(op: str, a: Any, b: Any) -> bool:
    rank = [x.sign * 2 if isinstance(x, Inf) else 0 for x in (a, b)]  # finite sits between
    if op == "==":
        return rank[0] == rank[1] and rank[0] != 0
    if rank[0] == rank[1]:
        if rank[0] == 0:  # unreachable: one side is infinite
            raise NonReal("comparison")
        return op == ">="
    return rank[0] > rank[1]


def negate(b: Bool) -> Bool:
    if isinstance(b, bool):
        return not b
    if isinstance(b, BoolOp) and b.op == "not":
        return b.args[0]
    if isinstance(b, Cmp) and b.op == ">":  # not (p > 0)  ==  (-p >= 0)
        return compare(">=", -b.poly, Poly.constant(0))
    if isinstance(b, Cmp) and b.op == ">=":
        return compare(">", -b.poly, Poly.constant(0))
    return _intern(BoolOp, ("bool", "not", id(b)), "not", (b,))


def bool_op(op: str, a: Bool, b: Bool) -> Bool:
    """``and``/``or`` (``xor`` as its two-term form)."""
    if op == "xor":
        return bool_op("or", bool_op("and", a, negate(b)), bool_op("and", negate(a), b))
    for x, y in ((a, b), (b, a)):
        if isinstance(x, bool):
            if op == "and":
                return y if x else False
            return True if x else y
    if a is b:
        return a
    args = frozenset((a, b))
    return _intern(BoolOp, ("bool", op, args), op, args)


class Ite(Term):
    __slots__ = ("cond", "then", "other")

    def _init(self, cond: Term, then: Poly, other: Poly) -> None:
        self.cond, self.then, self.other = cond, then, other
        self.skey = hash((6, cond.skey, then.skey, other.skey))

    def __repr__(self) -> str:
        return f"({self.cond!r} ? {self.then!r} : {self.other!r})"


def ite(cond: Bool, then: Any, other: Any) -> Any:
    if isinstance(cond, bool):
        return then if cond else other
    if isinstance(then, Inf) or isinstance(other, Inf):
        raise NonReal("a symbolic choice of an infinite value")
    if then is other:
        return then
    if isinstance(cond, BoolOp) and cond.op == "not":
        cond, then, other = cond.args[0], other, then
    # a common scale comes out: c ? k*a : k*b  ==  k * (c ? a : b), k the lead coefficient
    k = then.lead_coefficient() if then is not ZERO else other.lead_coefficient()
    if k and k != 1:
        then, other = then._scaled(1 / k), other._scaled(1 / k)
    factor = Poly.of_factor(_intern(Ite, ("ite", id(cond), id(then), id(other)),
                                    cond, then, other))
    return factor._scaled(k) if k else factor


# -- monomials and polys -----------------------------------------------------------------------


class Monomial(Term):
    """A product of factors with non-zero integer exponents (``powers``: factor -> exponent)."""

    __slots__ = ("powers",)

    def _init(self, powers: dict[Any, int]) -> None:
        self.powers = powers
        self.skey = hash(frozenset((f.skey, e) for f, e in powers.items()))

    @staticmethod
    def make(powers: dict[Any, int]) -> Monomial:
        key = _monomial_key(powers)
        term = _TABLE.get(key)
        if term is None:
            _full()
            term = object.__new__(Monomial)
            term._init(powers)
            _TABLE[key] = term
        return term

    def times(self, other: Monomial) -> dict[Any, int]:
        powers = dict(self.powers)
        for f, e in other.powers.items():
            n = powers.get(f, 0) + e
            if n:
                powers[f] = n
            else:
                del powers[f]
        return powers

    def __repr__(self) -> str:
        return "*".join(f"{f!r}" if e == 1 else f"{f!r}^{e}" for f, e in self.powers.items())


_ZERO = Fraction(0)
_ONE = Fraction(1)


# The table's keys for monomials and polys are flat tuples of the interned parts in the order
# of their ``id`` (a canonical order for one table's life): a monomial's ``(factor, exponent,
# ...)``, a poly's ``(numerator, denominator, monomial, numerator, denominator, ...)``. The
# parts are the objects the term holds anyway, so a key costs one tuple; a key of nested
# tuples or a frozenset cost several times the term itself. Coefficients enter as (numerator,
# denominator): equal exactly when the (normalised) fractions are, and hashed several times
# faster than a Fraction. No key of one kind equals a key of another: a monomial's starts with
# a term, a poly's with an int, the other terms' with a string.

def _id_of_first(item: tuple[Any, Any]) -> int:
    return id(item[0])


def _monomial_key(powers: dict[Any, int]) -> tuple[Any, ...]:
    if len(powers) == 1:
        return next(iter(powers.items()))
    key: list[Any] = []
    for f, e in sorted(powers.items(), key=_id_of_first):
        key += (f, e)
    return tuple(key)


def _poly_key(const: Fraction, terms: dict[Monomial, Fraction]) -> tuple[Any, ...]:
    key: list[Any] = [const.numerator, const.denominator]
    for m, c in (sorted(terms.items(), key=_id_of_first) if len(terms) > 1 else terms.items()):
        key += (m, c.numerator, c.denominator)
    return tuple(key)


class Poly(Term):
    """``const + sum(coefficient * monomial)``; immutable, interned, equality is ``is``."""

    __slots__ = ("const", "terms", "_product", "__weakref__")

    def _init(self, const: Fraction, terms: dict[Monomial, Fraction]) -> None:
        self.const, self.terms = const, terms
        self._product: tuple[Fraction, dict[Any, int]] | None = None
        self.skey = hash(((const.numerator, const.denominator),
                          frozenset((m.skey, c.numerator, c.denominator)
                                    for m, c in terms.items())))

    # -- construction ---------------------------------------------------------------------

    @staticmethod
    def make(const: Fraction, terms: dict[Monomial, Fraction]) -> Poly:
        key = _poly_key(const, terms)
        term = _TABLE.get(key)
        if term is None:
            _full()
            term = object.__new__(Poly)
            term._init(const, terms)
            _TABLE[key] = term
        return term

    @staticmethod
    def constant(value: Any) -> Poly:
        return Poly.make(_rational(value), {})

    @staticmethod
    def of_factor(factor: Term, exponent: int = 1) -> Poly:
        return Poly.make(_ZERO, {Monomial.make({factor: exponent}): _ONE})

    @staticmethod
    def sum(values: Iterable[Poly]) -> Poly:
        """The sum of many polys in one pass (no intermediate sums)."""
        const = _ZERO
        terms: dict[Monomial, Fraction] = {}
        get = terms.get
        for v in values:
            const += v.const
            for m, c in v.terms.items():
                terms[m] = get(m, _ZERO) + c
        return Poly.make(const, {m: c for m, c in terms.items() if c})

    # -- queries -------------------------------------------------------------------------

    @property
    def is_const(self) -> bool:
        return not self.terms

    def single_factor(self) -> Term | None:
        """The factor ``f`` when this poly is exactly ``f`` (coefficient 1, exponent 1)."""
        if self.const or len(self.terms) != 1:
            return None
        (m, c), = self.terms.items()
        if c != 1 or len(m.powers) != 1:
            return None
        (f, e), = m.powers.items()
        return f if e == 1 else None

    def lead_coefficient(self) -> Fraction:
        """The coefficient of the term with the smallest structural key (the constant when
        there are no terms)."""
        if not self.terms:
            return self.const
        m = min(self.terms, key=lambda t: t.skey)
        return self.terms[m]

    def _as_product(self) -> tuple[Fraction, dict[Any, int]]:
        """``self == coefficient * prod(f**e)``: a single term as itself, a sum as its content
        times its primitive part (a factor)."""
        if not self.const and len(self.terms) == 1:
            (m, c), = self.terms.items()
            return c, m.powers
        if self._product is None:
            self._product = self._factor_out()
        return self._product

    def _factor_out(self) -> tuple[Fraction, dict[Any, int]]:
        """Content, the factors common to every term (each at its least exponent: ``a*x +
        b*x = x*(a + b)``, ``e1/S + e2/S = (e1 + e2)/S``) and the primitive rest."""
        common: dict[Any, int] | None = None if not self.const else {}
        for m in self.terms:
            if common is None:
                common = dict(m.powers)
            else:
                common = {f: min(e, m.powers[f]) for f, e in common.items() if f in m.powers}
                common = {f: e for f, e in common.items() if e}
            if not common:
                break
        if common:
            inverse = {f: -e for f, e in common.items()}
            rest: dict[Monomial, Fraction] = {}
            const = _ZERO
            for m, c in self.terms.items():
                powers = m.times(Monomial.make(inverse))
                if powers:
                    rest[Monomial.make(powers)] = c
                else:
                    const += c
            core = Poly.make(const, rest)
        else:
            common, core = {}, self
        lead = core.lead_coefficient()
        primitive = core if lead == 1 else core._scaled(1 / lead)
        powers = dict(common or {})
        powers[primitive] = powers.get(primitive, 0) + 1
        if not powers[primitive]:  # a/(a+b) + b/(a+b): the sum cancels its own inverse
            del powers[primitive]
        return lead, powers

    def _scaled(self, k: Fraction) -> Poly:
        if k == 1:
            return self
        if k == 0:
            return ZERO
        return Poly.make(self.const * k, {m: c * k for m, c in self.terms.items()})

    # -- arithmetic -------------------------------------------------------------------------

    def __add__(self, other: Any) -> Any:
        if isinstance(other, Inf):
            return other + self
        other = as_poly(other)
        if not other.terms:
            return self if not other.const else Poly.make(self.const + other.const, self.terms)
        if not self.terms:
            return Poly.make(self.const + other.const, other.terms) if self.const else other
        return Poly.sum((self, other))

    __radd__ = __add__

    def __neg__(self) -> Poly:
        return self._scaled(Fraction(-1))

    def __sub__(self, other: Any) -> Any:
        if isinstance(other, Inf):
            return (-other) + self
        return self + (-as_poly(other))

    def __rsub__(self, other: Any) -> Poly:
        return as_poly(other) + (-self)

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, Inf):
            return other * self
        other = as_poly(other)
        if not other.terms:
            return self._scaled(other.const)
        if not self.terms:
            return other._scaled(self.const)
        if _single(self) and not _single(other) and _short(other):
            return _distribute(self, other)
        if _single(other) and not _single(self) and _short(self):
            return _distribute(other, self)
        ca, pa = self._as_product()
        cb, pb = other._as_product()
        powers = dict(pa)
        for f, e in pb.items():
            n = powers.get(f, 0) + e
            if n:
                powers[f] = n
            else:
                del powers[f]
        return _from_product(ca * cb, powers)

    __rmul__ = __mul__

    def inverse(self) -> Poly:
        if not self.terms:
            if not self.const:
                raise NonReal("division by zero")
            return Poly.make(1 / self.const, {})
        c, powers = self._as_product()
        return _from_product(1 / c, {f: -e for f, e in powers.items()})

    def __truediv__(self, other: Any) -> Poly:
        if isinstance(other, Inf):
            raise NonReal("division by an infinite value")
        return self * as_poly(other).inverse()

    def __rtruediv__(self, other: Any) -> Poly:
        return as_poly(other) * self.inverse()

    def power(self, n: int) -> Poly:
        if n == 0:
            return ONE
        if not self.terms:
            if not self.const and n < 0:
                raise NonReal("division by zero")
            return Poly.make(self.const ** n, {})
        c, powers = self._as_product()
        return _from_product(c ** n, {f: e * n for f, e in powers.items()})

    def __repr__(self) -> str:
        parts = [f"{c}*{m!r}" if c != 1 else repr(m) for m, c in self.terms.items()]
        if self.const or not parts:
            parts.append(str(self.const))
        return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]


#: A single term times a sum of fewer than this many terms distributes over it (``m*(a+b) =
#: m*a + m*b``): the short sums of a backward (``1 - s``, ``g - mean``) get the same form
#: whether the plan multiplies before or after adding them. Longer sums stay factored:
#: distributing every product grows a value by the contraction width at every matmul
#: (exponential in depth); ``check/expand.py`` expands only the obligations that need it.
#: The width in force: ``set_distribute`` (a proof tries ``DISTRIBUTE_LEAN`` first, then
#: ``DISTRIBUTE_WIDE``: ``check/prove.py``).
DISTRIBUTE = 5

#: Only two-term sums (``1 - s``, ``a + b``) distribute: the normal form stays close to the
#: computation's size. At tensor-parallel widths a block's cotangents are sums of three or
#: four terms (a residual's cotangent plus its branches', a causal attention row over its
#: first positions), and multiplying each of those into every product of a matrix product
#: gave ``attention.wo``'s weight gradient in ``llama3_8b_3d`` 168 terms per element where the
#: lean form has 36 (bench/results/check.md, session 27).
DISTRIBUTE_LEAN = 3
#: Sums of up to four terms distribute: more pairs get one normal form (a plan that spreads a
#: three-term cotangent over its partial products, where the reference multiplies it whole).
DISTRIBUTE_WIDE = 5


def set_distribute(width: int) -> None:
    """Make ``width`` the width in force and forget every term (terms made at one width are
    true values at the other too, but not in its normal form: equality would no longer be
    ``is``)."""
    global DISTRIBUTE
    DISTRIBUTE = width
    reset()


def _short(p: Poly) -> bool:
    n = len(p.terms) + (1 if p.const else 0)
    return 2 <= n < DISTRIBUTE and len(p.terms) >= 1


def _single(p: Poly) -> bool:
    return not p.const and len(p.terms) == 1


def _distribute(single: Poly, total: Poly) -> Poly:
    (m, c), = single.terms.items()
    terms: dict[Monomial, Fraction] = {}
    get = terms.get
    const = _ZERO
    for other, k in total.terms.items():
        product = _from_product(c * k, m.times(other))  # x * x^-1 cancels to a constant
        const += product.const
        for pm, pc in product.terms.items():
            terms[pm] = get(pm, _ZERO) + pc
    if total.const:
        terms[m] = get(m, _ZERO) + c * total.const
    return Poly.make(const, {k: v for k, v in terms.items() if v})


#: A product whose short sum factors (``_short``, positive exponents) multiply out to at most
#: this many terms is multiplied out, every other factor kept as it is: ``x * (1 - s)`` with
#: ``x`` a long sum becomes ``[x] - [x]*s``, ``[x]`` the long sum as one factor (so SiLU's
#: backward as the spec decomposes it, ``g*s*(1 + x*(1 - s))``, and as autograd of
#: ``x*sigmoid(x)`` computes it, ``g*s + g*x*s*(1 - s)``, have one normal form). A long sum
#: kept whole is a second form of the same value beside its flattened terms: sound (it
#: evaluates to the same number), only less complete, and what normal form leaves open goes
#: to ``check/expand.py``.
EXPAND_SHORT = 64


def _from_product(coefficient: Fraction, powers: dict[Any, int]) -> Poly:
    if not coefficient:
        return ZERO
    if not powers:
        return Poly.make(coefficient, {})
    shorts = [(f, e) for f, e in powers.items()
              if e > 0 and isinstance(f, Poly) and _short(f)]
    if shorts and (len(powers) > 1 or shorts[0][1] > 1):
        count = 1
        for f, e in shorts:
            count *= (len(f.terms) + (1 if f.const else 0)) ** e
        if count <= EXPAND_SHORT:
            return _expand_shorts(coefficient, powers, shorts)
    if len(powers) == 1:
        (f, e), = powers.items()
        if e == 1 and isinstance(f, Poly):  # a lone sum factor is the sum itself
            return f._scaled(coefficient)
    return Poly.make(_ZERO, {Monomial.make(powers): coefficient})


def _expand_shorts(coefficient: Fraction, powers: dict[Any, int],
                   shorts: list[tuple[Poly, int]]) -> Poly:
    """``coefficient * prod(f**e)`` with the ``shorts`` multiplied out."""
    rest = {f: e for f, e in powers.items() if not any(f is s for s, _ in shorts)}
    total = Poly.make(_ZERO, {Monomial.make(rest): coefficient}) if rest else \
        Poly.make(coefficient, {})
    for f, e in shorts:
        for _ in range(e):
            total = _times_sum(total, f)
    return total


def _times_sum(total: Poly, short: Poly) -> Poly:
    """``total * short`` term by term (neither side holds a short sum factor)."""
    parts = [short._scaled(total.const)] if total.const else []
    for m, c in total.terms.items():
        parts.append(_distribute(Poly.make(_ZERO, {m: c}), short))
    return Poly.sum(parts)


def dot(xs: list[Any], ys: list[Any]) -> Poly | None:
    """``sum(x * y for x, y in zip(xs, ys))``, the same poly, made without interning each
    product: a product of two single terms whose factors need no rewriting (no cancellation
    to a constant, no short sum to multiply out, not a lone sum) is its merged monomial, and
    a constant factor scales the other side's terms; every other product is ``x * y``.
    ``None`` when an operand is not a poly (an infinity): the caller multiplies one by one."""
    const = _ZERO
    terms: dict[Monomial, Fraction] = {}
    get = terms.get
    for x, y in zip(xs, ys, strict=True):
        if not isinstance(x, Poly) or not isinstance(y, Poly):
            return None
        xt, yt = x.terms, y.terms
        if not xt or not yt:
            if not xt and not yt:
                const += x.const * y.const
                continue
            k, p = (x.const, y) if not xt else (y.const, x)
            if k:
                const += p.const * k
                for m, c in p.terms.items():
                    terms[m] = get(m, _ZERO) + c * k
            continue
        if not x.const and not y.const and len(xt) == 1 and len(yt) == 1:
            (mx, cx), = xt.items()
            (my, cy), = yt.items()
            powers = mx.times(my)
            if powers and not any(e > 0 and isinstance(f, Poly) and
                                  (_short(f) or (e == 1 and len(powers) == 1))
                                  for f, e in powers.items()):
                m = Monomial.make(powers)
                terms[m] = get(m, _ZERO) + cx * cy
                continue
        product = x * y
        if not isinstance(product, Poly):
            return None
        const += product.const
        for m, c in product.terms.items():
            terms[m] = get(m, _ZERO) + c
    return Poly.make(const, {m: c for m, c in terms.items() if c})


def as_poly(value: Any) -> Poly:
    if isinstance(value, Poly):
        return value
    if isinstance(value, Term):
        raise TypeError(f"{value!r} is a boolean, not a number")
    return Poly.constant(value)


ZERO = Poly.make(_ZERO, {})
ONE = Poly.make(_ONE, {})


def reset() -> None:
    """Forget every interned term (between independent checks, to bound memory); ``ZERO``
    and ``ONE`` stay (other modules hold them). Terms made before a reset never equal terms
    made after it: never mix them."""
    _TABLE.clear()
    _TABLE[_poly_key(_ZERO, {})] = ZERO
    _TABLE[_poly_key(_ONE, {})] = ONE


def forget_since(count: int) -> None:
    """Forget the terms interned after the table held ``count`` (a scratch computation's,
    ``expand.stepwise_zero``), except those something outside the table still references
    (an older poly's cached product, a caller's value): those stay, so that the table's one
    object per value is never duplicated. Newest first, so a parent is gone before its
    children are looked at."""
    kept: list[tuple[Any, Any]] = []
    while len(_TABLE) > count:
        key, term = _TABLE.popitem()
        if sys.getrefcount(term) > 2:  # ``term`` and the call's argument
            kept.append((key, term))
        del term
    for key, term in reversed(kept):
        _TABLE[key] = term


class Inf:
    """``+inf`` or ``-inf`` (``INF``, ``NEG_INF``): only where a program masks with it (a
    causal mask fills scores with ``-inf``; ``exp`` of it is 0, ``max`` ignores it). Anything
    with no real meaning (``inf - inf``, ``inf * x`` for a symbolic ``x``) is ``NonReal``."""

    __slots__ = ("sign",)

    def __init__(self, sign: int) -> None:
        self.sign = sign

    def __repr__(self) -> str:
        return "inf" if self.sign > 0 else "-inf"

    def __add__(self, other: Any) -> Inf:
        if isinstance(other, Inf) and other.sign != self.sign:
            raise NonReal("inf - inf")
        return self  # a real plus an infinity (symbolic values are real, so finite)

    __radd__ = __add__

    def __neg__(self) -> Inf:
        return INF if self.sign < 0 else NEG_INF

    def __sub__(self, other: Any) -> Inf:
        return self + (-other if isinstance(other, Inf) else other)

    def __rsub__(self, other: Any) -> Inf:
        return -self

    def __mul__(self, other: Any) -> Inf:
        if isinstance(other, Inf):
            return INF if other.sign == self.sign else NEG_INF
        p = as_poly(other)
        if not p.is_const or not p.const:
            raise NonReal(f"{self!r} times {p!r}")
        return self if p.const > 0 else -self

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Inf:
        p = as_poly(other)
        if not p.is_const or not p.const:
            raise NonReal(f"{self!r} divided by {p!r}")
        return self if p.const > 0 else -self


INF = Inf(1)
NEG_INF = Inf(-1)


# -- numeric evaluation (tests and the check of a solver's model) ------------------------------


def evaluate(term: Any, env: dict[str, float], functions: dict[str, Any],
             memo: dict[int, Any] | None = None) -> Any:
    """The value of ``term`` with variables from ``env`` and function symbols from
    ``functions`` (``exp`` -> ``math.exp``...); booleans evaluate to Python bools."""
    memo = {} if memo is None else memo
    key = id(term)
    if key in memo:
        return memo[key]
    if isinstance(term, bool):
        return term
    if isinstance(term, Poly):
        value = float(term.const) + sum(
            float(c) * evaluate(m, env, functions, memo) for m, c in term.terms.items())
    elif isinstance(term, Monomial):
        value = 1.0
        for f, e in term.powers.items():
            value *= evaluate(f, env, functions, memo) ** e
    elif isinstance(term, Var):
        value = env[term.name]
    elif isinstance(term, App):
        value = functions[term.fn](*(evaluate(a, env, functions, memo) for a in term.args))
    elif isinstance(term, Lattice):
        vals = [evaluate(a, env, functions, memo) for a in term.args]
        value = max(vals) if term.kind == "max" else min(vals)
    elif isinstance(term, Cmp):
        p = evaluate(term.poly, env, functions, memo)
        value = p > 0 if term.op == ">" else p >= 0 if term.op == ">=" else p == 0
    elif isinstance(term, BoolOp):
        vals = [evaluate(a, env, functions, memo) for a in term.args]
        value = (not vals[0]) if term.op == "not" else all(vals) if term.op == "and" \
            else any(vals)
    elif isinstance(term, Ite):
        branch = term.then if evaluate(term.cond, env, functions, memo) else term.other
        value = evaluate(branch, env, functions, memo)
    else:
        raise TypeError(f"not a term: {term!r}")
    memo[key] = value
    return value


def subterms(term: Any) -> list[Any]:
    """Every distinct sub-term of ``term`` (itself included), each once."""
    seen: set[int] = set()
    out: list[Any] = []
    stack = [term]
    while stack:
        t = stack.pop()
        if id(t) in seen or isinstance(t, bool):
            continue
        seen.add(id(t))
        out.append(t)
        stack.extend(children(t))
    return out


def variables(term: Any) -> set[str]:
    """The names of the variables ``term`` depends on."""
    return {t.name for t in subterms(term) if isinstance(t, Var)}


def size(term: Any) -> int:
    """The number of distinct sub-terms (the DAG's size)."""
    return len(subterms(term))


def children(t: Any) -> tuple[Any, ...]:
    if isinstance(t, Poly):
        return tuple(t.terms)
    if isinstance(t, Monomial):
        return tuple(t.powers)
    if isinstance(t, App):
        return t.args
    if isinstance(t, Lattice):
        return tuple(t.args)
    if isinstance(t, Cmp):
        return (t.poly,)
    if isinstance(t, BoolOp):
        return tuple(t.args)
    if isinstance(t, Ite):
        return (t.cond, t.then, t.other)
    return ()
