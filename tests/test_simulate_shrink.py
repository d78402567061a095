"""Sound shrinking for ``tvp simulate`` (docs/semantics.md, "Shrinking for simulation").

The rule itself (``shrink_widths``) on hand-made divisibilities, with a hypothesis property;
the sizes it gives real plans, which must not depend on axis or input names; and one
regression per gap of issue 8: a split that does not divide the real size is an error of
``tvp simulate`` (exit 1, never "agrees"), and correct plans with unconventional names or ZeRO
over a tensor-parallel layout agree.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainverify_dsl.api import _plain, locate_model, resolve_plan
from trainverify_dsl.cli.main import main
from trainverify_dsl.cli.simulate_cmd import agrees
from trainverify_dsl.shrink import Divisibility, monomial, shrink_plan, shrink_widths

MEGATRON = Path(__file__).resolve().parents[1] / "stdlib" / "megatron.tvp"


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def rule(widths: dict[str, int], axes: dict[str, int], whole: bool = False,
         constant: int = 1) -> Divisibility:
    return Divisibility(tuple(widths.items()), tuple(axes.items()), whole=whole,
                        constant=constant)


def product(widths: dict[str, int], rule: Divisibility) -> int:
    return math.prod(widths[w] ** e for w, e in rule.widths) * rule.constant


# -- the rule -------------------------------------------------------------------------------


def test_a_split_that_does_not_divide_stays_one_that_does_not() -> None:
    # tp=3 over an MLP width of 8: rebuilding the width from the mesh (2 * tp) hid the error
    shrunk = shrink_widths({"d_hidden": 8}, [rule({"d_hidden": 1}, {"tp": 3})], {}, {})
    assert shrunk["d_hidden"] % 3 != 0 and 2 <= shrunk["d_hidden"] <= 8


def test_a_vocabulary_without_the_mesh_factor_keeps_none() -> None:
    shrunk = shrink_widths({"vocab_size": 50257}, [rule({"vocab_size": 1}, {"tp": 2})], {}, {})
    assert shrunk["vocab_size"] % 2 == 1 and shrunk["vocab_size"] >= 2


def test_a_width_keeps_exactly_the_factors_of_the_axes_that_split_it() -> None:
    rules = [rule({"hidden": 1}, {"tp": 8}), rule({"batch": 1}, {"dp": 4, "@mb": 16})]
    assert shrink_widths({"hidden": 4096, "batch": 512}, rules, {}, {}) == \
        {"hidden": 8, "batch": 64}


def test_zero_blocks_take_their_factors_from_a_width_with_some_to_spare() -> None:
    # ZeRO over dp=4 of a weight whose rows are n_heads * head_dim, split over tp=2
    widths = {"n_heads": 4, "head_dim": 128}
    rules = [rule({"n_heads": 1, "head_dim": 1}, {"tp": 2}),
             rule({"n_heads": 1, "head_dim": 1}, {"tp": 2, "dp": 4}, whole=True)]
    shrunk = shrink_widths(widths, rules, {}, {})
    assert (shrunk["n_heads"] * shrunk["head_dim"]) % 8 == 0
    assert shrunk["n_heads"] % 2 == 0 and shrunk["head_dim"] % 2 == 0  # a reshape into heads


def test_minimum_two_and_never_above_the_full_width() -> None:
    shrunk = shrink_widths({"a": 7, "b": 1, "c": 2, "d": 3}, [rule({"a": 1}, {"x": 2})], {}, {})
    assert shrunk == {"a": 3, "b": 1, "c": 2, "d": 3}  # 2 would make `a` divisible by x


def test_a_kept_count_supplies_the_factors_it_holds() -> None:
    """DeepSeek-V3 671B: the 256 routed experts are ``n_group`` (8, a count the model keeps)
    times ``experts_per_group`` (32); ep=8 splits them, ZeRO over dp=4 cuts each rank's 32
    experts and the router's 256 rows. The 8 holds ep's factors at every size, so the experts
    per group keep only dp's 4 (they kept all 32, and the reference's MoE outgrew the proof)."""
    widths = {"experts_per_group": 32}
    epg = {"experts_per_group": 1}
    rules = [rule(epg, {"ep": 8}, constant=8), rule(epg, {"ep": 8, "dp": 4}, True, 8),
             rule(epg, {"dp": 4}, True, 8)]
    assert [r.uncredited() for r in rules] == [(), (("dp", 4),), ()]
    assert shrink_widths(widths, rules, {}, {}) == {"experts_per_group": 4}
    # a constant that holds only part of an axis credits none of it
    assert rule(epg, {"tp": 8}, constant=2).uncredited() == (("tp", 8),)
    assert shrink_widths({"experts_per_group": 32}, [rule(epg, {"tp": 8}, constant=2)],
                         {}, {}) == {"experts_per_group": 8}


def test_outermost_heads_take_a_split_and_leave_the_head_dims_uncut() -> None:
    """DeepSeek-V3's MLA lays ``wq_b``'s rows out as ``n_heads * (qk_nope + qk_rope)``, heads
    outermost (``OUTERMOST``): 128 heads over tp=8 take the split, so the head dims keep no
    factor of it (they kept 8 each, quadrupling every attention score's sum)."""
    widths = {"n_heads": 128, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
              "v_head_dim": 128}
    heads = (("n_heads", 1),)
    rules = [Divisibility(heads, (("tp", 8),), (("qk_nope_head_dim", "qk_rope_head_dim"),)),
             Divisibility(heads + (("v_head_dim", 1),), (("tp", 8),))]
    least = {"qk_rope_head_dim": 2}
    assert shrink_widths(widths, rules, least, {}, (), ("n_heads",)) == \
        {"n_heads": 8, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2}
    assert shrink_widths(widths, rules, least, {}) == \
        {"n_heads": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}
    # 4 heads over tp=8: the split reaches into the head dims, which keep its factors
    assert shrink_widths({**widths, "n_heads": 4}, rules, least, {}, (), ("n_heads",)) == \
        {"n_heads": 4, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}


def test_a_widths_own_multiple_is_not_a_constant() -> None:
    """A probe ``head_dim`` is twice its prime (RoPE's pairs): the 2 belongs to the width,
    which supplies it shrunk, and is not credited; nor is anything beside ``head_dim / 2``."""
    primes, probe = {"head_dim": 101, "epg": 103}, {"head_dim": 202, "epg": 103}
    assert monomial(202, probe, primes) == ((("head_dim", 1),), (), 1)
    assert monomial(101, probe, primes) == ((("head_dim", 1),), (), 1)
    assert monomial(8 * 103, probe, primes) == ((("epg", 1),), (), 8)
    assert monomial(3 * 202 * 103, probe, primes) == ((("epg", 1), ("head_dim", 1)), (), 3)


def test_model_multiples_and_least_values_are_kept() -> None:
    shrunk = shrink_widths({"head_dim": 128, "experts": 64}, [], {"head_dim": 2},
                           {"experts": 6})
    assert shrunk["head_dim"] == 2 and shrunk["experts"] >= 6


MESH = st.fixed_dictionaries({a: st.sampled_from([2, 3, 4, 6]) for a in ("a", "b", "c", "@mb")})
WIDTH = st.builds(lambda e2, e3, e5, k: 2 ** e2 * 3 ** e3 * 5 ** e5 * k,
                  st.integers(0, 6), st.integers(0, 3), st.integers(0, 1),
                  st.sampled_from([1, 7, 11]))


@settings(max_examples=200, deadline=None)
@given(widths=st.dictionaries(st.sampled_from(["u", "v", "w", "z"]), WIDTH, min_size=1),
       data=st.data())
def test_every_divisibility_holds_shrunk_exactly_when_it_holds_at_full_size(
        widths: dict[str, int], data: st.DataObject) -> None:
    names = sorted(widths)
    mesh = data.draw(MESH)  # one size per axis, as in a plan
    monomials = st.dictionaries(st.sampled_from(names), st.integers(1, 2), min_size=1)
    axes = st.lists(st.sampled_from(sorted(mesh)), min_size=1, max_size=3, unique=True).map(
        lambda names_: {a: mesh[a] for a in names_})
    constants = st.sampled_from([1, 1, 2, 3, 4, 6, 8, 12])  # a count the model keeps
    rules = data.draw(st.lists(st.builds(rule, monomials, axes, st.booleans(), constants),
                               max_size=5))
    shrunk = shrink_widths(widths, rules, {}, {})
    for r in rules:
        assert (product(widths, r) % r.n == 0) == (product(shrunk, r) % r.n == 0), r
        if not r.whole:  # every sub-product too (a reshape of the dimension into heads;
            # a credited constant is laid out outside them, as DeepSeek's expert groups are)
            outer = {r.constant} | ({1} if r.uncredited() == r.axes else set())
            for w, _ in r.widths:
                for c in outer:
                    assert (c * widths[w] % r.n == 0) <= (c * shrunk[w] % r.n == 0), (r, c)
    for w in widths:
        assert 1 <= shrunk[w] <= widths[w] and (shrunk[w] >= 2 or widths[w] < 2)


CHAIN = ("u", "v", "w")  # nested widths, outermost first (Llama: n_kv_heads, kv_group, head_dim)


@settings(max_examples=200, deadline=None)
@given(widths=st.fixed_dictionaries({w: WIDTH for w in CHAIN}), data=st.data())
def test_nested_widths_keep_every_outer_prefix_divisible_as_at_full_size(
        widths: dict[str, int], data: st.DataObject) -> None:
    """A dimension of nested widths is reshaped outer-major: a split falls on an outer prefix,
    so every prefix (not every sub-product) divides shrunk exactly when it does at full size."""
    mesh = data.draw(MESH)
    members = st.lists(st.sampled_from(CHAIN), min_size=1, max_size=3, unique=True)
    axes = st.lists(st.sampled_from(sorted(mesh)), min_size=1, max_size=3, unique=True).map(
        lambda names_: {a: mesh[a] for a in names_})
    rules = data.draw(st.lists(st.builds(lambda m, a, whole: rule(dict.fromkeys(m, 1), a, whole),
                                         members, axes, st.booleans()), max_size=5))
    shrunk = shrink_widths(widths, rules, {}, {}, (CHAIN,))
    for r in rules:
        assert (product(widths, r) % r.n == 0) == (product(shrunk, r) % r.n == 0), r
        if not r.whole:
            ordered = sorted((w for w, _ in r.widths), key=CHAIN.index)
            for j in range(1, len(ordered) + 1):
                full = math.prod(widths[w] for w in ordered[:j])
                small = math.prod(shrunk[w] for w in ordered[:j])
                assert (full % r.n == 0) == (small % r.n == 0), (r, ordered[:j])
    for w in widths:
        assert 1 <= shrunk[w] <= widths[w] and (shrunk[w] >= 2 or widths[w] < 2)


def test_heads_absorbing_the_split_leave_head_dim_unsplit() -> None:
    # Llama3-8B's query rows over tp=8: the 8 kv heads take the whole split; the group ratio
    # and head_dim keep no tp factor (before: head_dim 8 and kv_group 4, hidden 256)
    widths = {"n_kv_heads": 8, "kv_group": 4, "head_dim": 128}
    rules = [rule({"head_dim": 1, "kv_group": 1, "n_kv_heads": 1}, {"tp": 8})]
    chain = ("n_kv_heads", "kv_group", "head_dim")
    assert shrink_widths(widths, rules, {"head_dim": 2}, {}, (chain,)) == \
        {"n_kv_heads": 8, "kv_group": 2, "head_dim": 2}
    # 4 kv heads over tp=8: the split reaches the group ratio, which keeps its tp factors
    widths4 = {**widths, "n_kv_heads": 4}
    assert shrink_widths(widths4, rules, {"head_dim": 2}, {}, (chain,)) == \
        {"n_kv_heads": 4, "kv_group": 4, "head_dim": 2}
    # without the nesting (a user's model) every width keeps the factors
    assert shrink_widths(widths, rules, {"head_dim": 2}, {}) == \
        {"n_kv_heads": 8, "kv_group": 4, "head_dim": 8}


# -- sizes of plans: names mean nothing -----------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    """The plan, with a ``spec-optimizer`` stating the plan's own optimizer recipe (these
    tests are about sizes, not about the optimizer)."""
    lines = textwrap.dedent(text).lstrip().replace("MEGATRON", str(MEGATRON)).splitlines()
    recipe = [line.split(" shard over")[0].replace("optimizer", "spec-optimizer", 1)
              for line in lines if line.startswith("optimizer ")]
    path = tmp_path / f"{name}.tvp"
    path.write_text("\n".join(lines + recipe) + "\n")
    return path


def mlp_plan(axis: str = "tp", dp: int = 2, tp: int = 2, extra: str = "",
             spec: str = "config mlp_small batch 64 seq 1", optimizer: str = "") -> str:
    return f"""
        plan mlp
        spec "stdlib/models/mlp.py:MLP" {spec}
        mesh dp={dp}, {axis}={tp}
        use "MEGATRON"
        split x [dp, -]
        split target [dp, -]
        apply column_parallel_bias(fc1, {axis})
        apply row_parallel_bias(fc2, {axis})
        {extra}
        all-reduce grad(params) over dp op=avg
        optimizer sgd lr=0.1{optimizer}
        """


def sizes(path: Path) -> tuple[dict[str, int], int, int]:
    plan = resolve_plan(path)
    assert plan.spec is not None
    settings_ = {k: _plain(v) for k, v in plan.spec.settings
                 if k not in ("config", "batch", "seq")}
    shrunk = shrink_plan(plan, settings_, locate_model(plan, path, allow_outside_root=True))
    return shrunk.overrides, shrunk.batch, shrunk.seq


def test_axis_names_mean_nothing(tmp_path: Path) -> None:
    assert sizes(write(tmp_path, "tp", mlp_plan("tp"))) == \
        sizes(write(tmp_path, "mp", mlp_plan("mp")))


def test_a_batch_split_is_found_by_layout_not_by_input_name(tmp_path: Path) -> None:
    path = write(tmp_path, "inp", """
        plan inp
        spec "tests/models/tiny_nets.py:RenamedInputs" d 256 hidden 1024 batch 96 seq 4
        mesh rows=3, mp=2
        microbatches 2
        use "MEGATRON"
        split inp [rows, -, -]
        split goal [rows, -, -]
        apply column_parallel(fc1, mp)
        apply row_parallel(fc2, mp)
        all-reduce grad(params) over rows op=avg
        optimizer sgd lr=0.1
        """)
    overrides, batch, seq = sizes(path)
    assert batch == 6 and seq == 2  # rows x microbatches; the sequence is not split
    assert overrides["hidden"] == 2 and overrides["d"] == 2  # mp splits hidden, nothing d


@pytest.mark.parametrize("order, option, seq", [("cp", "", 4), ("zigzag(cp)", "", 8),
                                               ("cp", " order=zigzag", 8)])
def test_a_zigzag_sequence_keeps_two_chunks_per_rank(tmp_path: Path, order: str, option: str,
                                                     seq: int) -> None:
    """docs/semantics.md §2.6 and §9: a sequence split over cp=4 in zigzag order is cut into
    8 chunks, so the shrunk sequence keeps the factor 2 as well (8192 -> 8, not 4). So does
    an attention whose own `order=zigzag` cuts a contiguous split (the algorithm's need, from
    its registry entry: a fuzz of tvp check found the shrunk plan failing to lower, an
    internal error, where the full-size one lowered and differed)."""
    path = write(tmp_path, "zigzag", f"""
        plan zigzag
        spec "stdlib/models/llama.py:Llama" config llama3_8b batch 8 seq 8192 n_layers 1
        mesh dp=2, cp=4
        split tokens [dp, {order}]
        split labels [dp, {order}]
        algorithm context-parallel-attention for layers.*.attention over cp{option}
        all-reduce grad(params) over dp, cp op=avg
        optimizer sgd lr=0.01
        """)
    assert sizes(path)[2] == seq


# -- regressions: tvp simulate, end to end --------------------------------------------------


def simulate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["simulate", str(path)])
    return code, capsys.readouterr().out


def test_tp3_over_an_mlp_width_of_8_is_an_error(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "tp3", mlp_plan(tp=3, spec="config mlp_small d_hidden 8 batch 64 "
                                                      "seq 1"))
    code, out = simulate(path, capsys)
    assert code == 1 and "agrees" not in out
    # reported by the full-size pass (at the template line that splits the weight)
    assert "size 8, not divisible by tp (3)" in out and "TVP234" in out


def test_gpt2_vocabulary_over_tp2_is_an_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "gpt2", """
        plan gpt2_vocab
        spec "stdlib/models/gpt2.py:GPT2" config gpt2_small batch 8 seq 16
        mesh dp=2, tp=2
        use "MEGATRON"
        split tokens [dp, -]
        split labels [dp, -]
        apply vocab_parallel_embedding(embed, tp)
        all-reduce grad(params) over dp op=avg
        optimizer sgd lr=0.1
        """)
    code, out = simulate(path, capsys)
    assert code == 1 and "agrees" not in out
    assert "size 50257, not divisible by tp (2)" in out and "TVP234" in out


def test_8_kv_heads_over_tp16_is_an_error(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "kv", """
        plan kv_heads
        spec "stdlib/models/llama.py:Llama" config llama_tiny SIZES
        mesh tp=16
        use "MEGATRON"
        for l in layers:
            apply attention_parallel(l.attention, tp)
        optimizer sgd lr=0.1
        """.replace("SIZES", "hidden 512 n_heads 32 n_kv_heads 8 batch 2 seq 4"))
    code, out = simulate(path, capsys)
    assert code == 1 and "agrees" not in out and "[TVP4" in out


def test_megatron_on_an_axis_named_mp_agrees(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "mp", mlp_plan("mp", dp=2, tp=4))
    code, out = simulate(path, capsys)
    assert code == 0 and "agrees" in out, out


def test_a_model_whose_input_is_inp_agrees(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "inp", """
        plan inp
        spec "tests/models/tiny_nets.py:RenamedInputs" d 256 hidden 1024 batch 96 seq 4
        mesh dp=2, tp=2
        microbatches 2
        loss-scale 1/microbatches
        use "MEGATRON"
        split inp [dp, -, -]
        split goal [dp, -, -]
        apply column_parallel(fc1, tp)
        apply row_parallel(fc2, tp)
        all-reduce grad(params) over dp op=avg
        optimizer sgd lr=0.1
        """)
    code, out = simulate(path, capsys)
    assert code == 0 and "agrees" in out and "shrunk:" in out, out


def test_zero_over_dp_with_tp_agrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "zero", mlp_plan(dp=4, tp=2, optimizer=" shard over dp")
                 .replace("optimizer sgd lr=0.1 shard", "optimizer adam lr=0.001 shard"))
    code, out = simulate(path, capsys)
    assert code == 0 and "agrees" in out, out


def test_agrees_is_false_when_an_error_was_reported() -> None:
    from trainverify_dsl.report.codes import lookup
    from trainverify_dsl.report.diagnostics import Diagnostic
    from trainverify_dsl.report.span import Span

    class Result:
        agrees = True
        findings = [Diagnostic(lookup("split-not-divisible"), "m", Span("p.tvp", 1, 1, 1, 2))]

    assert not agrees(Result())
    Result.findings = []
    assert agrees(Result())


def test_a_shrunk_plan_that_loses_a_divisibility_is_an_internal_error_not_agrees(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainverify_dsl import shrink

    def broken(widths, rules, multiples, least, chains=(), outer=()):  # tp=2 cannot split 3
        return {w: 3 if w == "d_hidden" else v for w, v in widths.items()}

    monkeypatch.setattr(shrink, "shrink_widths", broken)
    code = main(["simulate", str(write(tmp_path, "lost", mlp_plan()))])
    captured = capsys.readouterr()
    assert code == 2 and "agrees" not in captured.out
    assert "ShrinkingLostDivisibility" in captured.err and "d_hidden" in captured.err


def test_a_sum_of_widths_grows_only_its_smallest_summand() -> None:
    # DeepSeek's MLA: wkv_a has kv_lora_rank + qk_rope_head_dim rows, cut into 16 ZeRO blocks;
    # wq has n_heads * (qk_nope_head_dim + qk_rope_head_dim), split over tp=4, 64 blocks
    widths = {"n_heads": 16, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
              "kv_lora_rank": 512}
    sums = (("qk_nope_head_dim", "qk_rope_head_dim"),)
    rules = [Divisibility((("n_heads", 1),), (("tp", 4),), sums),
             Divisibility((("n_heads", 1),), (("tp", 4), ("dp", 16)), sums, whole=True),
             Divisibility((), (("dp", 16),), (("kv_lora_rank", "qk_rope_head_dim"),),
                          whole=True),
             Divisibility((("kv_lora_rank", 1),), (("dp", 16),), (), whole=True)]
    shrunk = shrink_widths(widths, rules, {"qk_rope_head_dim": 2}, {})
    assert (shrunk["kv_lora_rank"] + shrunk["qk_rope_head_dim"]) % 16 == 0
    assert shrunk["n_heads"] * (shrunk["qk_nope_head_dim"] + shrunk["qk_rope_head_dim"]) % 64 == 0
    assert shrunk["qk_rope_head_dim"] == 16  # not raised in lockstep with kv_lora_rank to 64


def test_a_sum_divisible_only_as_a_sum_is_kept_divisible() -> None:
    """Session 19, outside report: DeepSeek's wkv_a has 512 + 64 rows, split over 3; neither
    summand has the factor, so each kept none and the shrunk 2 + 2 rows did not divide
    (ShrinkingLostDivisibility on a correct plan). The summands now take the least values
    whose sum divides, each with no mesh prime more often than at full size."""
    widths = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden": 2048}
    rules = [Divisibility((), (("g", 3),), (("kv_lora_rank", "qk_rope_head_dim"),)),
             Divisibility((("hidden", 1),), (("dp", 2),))]
    shrunk = shrink_widths(widths, rules, {"qk_rope_head_dim": 2}, {})
    assert (shrunk["kv_lora_rank"] + shrunk["qk_rope_head_dim"]) % 3 == 0
    assert shrunk["qk_rope_head_dim"] % 2 == 0 and shrunk["hidden"] % 2 == 0
    for w in widths:  # no factor 3 appears in a summand; nothing grows beyond full size
        assert shrunk[w] % 3 != 0 and 2 <= shrunk[w] <= widths[w]
    assert sum(shrunk[w] for w in ("kv_lora_rank", "qk_rope_head_dim")) == 6


def test_a_column_parallel_latent_projection_over_3_agrees(tmp_path: Path) -> None:
    plan = tmp_path / "wkv_a.tvp"
    model = f"{MEGATRON.parent.as_posix()}/models/deepseek.py:DeepSeekV3"
    plan.write_text(textwrap.dedent(f"""\
        plan wkv_a_over_3
        spec "{model}" config deepseek_v3_16b batch 4 seq 16 n_layers 2
        spec-optimizer sgd lr=0.01
        mesh g=3
        split layers.*.attention.wkv_a.weight [g, -]
        copy layers.*.attention.wkv_a.in over g
        all-gather layers.*.attention.wkv_a.out over g dim=2 backward scatter
        optimizer sgd lr=0.01
        """))
    assert main(["simulate", str(plan)]) == 0


USER_FIELDS = textwrap.dedent('''\
    import torch
    from torch import nn


    class Post(nn.Module):
        def __init__(self, mode):
            super().__init__()
            self.mode = mode

        def forward(self, y):
            return y * 2.0 if self.mode == 2 else y + 1.0  # linear only in mode 2


    class PartNet(nn.Module):
        def __init__(self, mode=0, width=8):
            super().__init__()
            self.up = nn.Linear(4, width, bias=False)
            self.mix = nn.Linear(width, 4, bias=False)
            self.post = Post(mode)
            self.out = nn.Linear(4, 4, bias=False)

        def input_specs(self, batch, seq):
            return {"inp": ((batch, 4), torch.float32), "tgt": ((batch, 4), torch.float32)}

        def forward(self, inp, tgt):
            e = self.out(torch.tanh(self.post(self.mix(torch.tanh(self.up(inp)))))) - tgt
            return (e * e).mean()


    class DeclaredPartNet(PartNet):
        WIDTHS = ("width",)
''')


def user_fields_plan(tmp_path: Path, cls: str, settings_: str) -> Path:
    """The row-parallel output of ``mix`` is reduced only after ``post``: right when
    ``post`` is linear (mode 2), wrong otherwise (the constant added on every mp rank)."""
    (tmp_path / "partnet.py").write_text(USER_FIELDS)
    return write(tmp_path, cls, f"""
        plan fields
        spec "partnet.py:{cls}" batch 4 seq 1 {settings_}
        mesh mp=2
        split up.weight [mp, -]
        copy up.in over mp
        split mix.weight [-, mp]
        all-reduce post.out over mp
        optimizer sgd lr=0.1
        """)


def test_a_users_field_that_selects_code_is_never_shrunk(tmp_path: Path) -> None:
    """``mode 3`` was read as a width and shrunk to 2, where the model is linear: tvp check
    verified the wrong plan (and with ``mode 300`` simulate agreed) while a real run
    differs. A model's own fields keep their values unless its class lists them in
    ``WIDTHS``; only batch and seq shrink."""
    from trainverify_dsl.api import check_file

    for mode in (3, 300):
        path = user_fields_plan(tmp_path, "PartNet", f"mode {mode} width 512")
        overrides, batch, seq = sizes(path)
        assert "mode" not in overrides and "width" not in overrides
        # (the layout pass now also sees the number added to the partial sum: TVP405)
        assert check_file(path, allow_model_outside_root=True).verdict == "counterexample"
    assert check_file(user_fields_plan(tmp_path, "PartNet", "mode 2"),
                      allow_model_outside_root=True).verdict == "verified"


def test_a_users_declared_widths_are_shrunk(tmp_path: Path) -> None:
    overrides, _, _ = sizes(user_fields_plan(tmp_path, "DeclaredPartNet", "mode 3 width 512"))
    assert overrides.get("width") == 2 and "mode" not in overrides


def test_a_gradient_reduce_scatter_keeps_its_divisibility_when_shrunk(tmp_path: Path) -> None:
    """Megatron tp=2 over the MLP's hidden width and `reduce-scatter grad(params) over dp
    dim=0` with no sharded optimizer (Galvatron's zero2 import writes this): the hidden width
    shrank to 2, whose tp-local 1 dp cannot divide, and `tvp check` ended in an internal
    error (ShrinkingLostDivisibility) on a plan simulate agreed with."""
    from trainverify_dsl.api import check_file

    root = Path(__file__).resolve().parents[1]
    path = tmp_path / "rs.tvp"
    path.write_text(textwrap.dedent(f'''\
        plan mlp_rs
        spec "{root}/stdlib/models/mlp.py:MLP" config mlp_tiny batch 8 seq 1 d_out 4
        mesh dp=2, tp=2
        use "{root}/stdlib/megatron.tvp"
        split x [dp, -]
        split target [dp, -]
        apply column_parallel_bias(fc1, tp)
        apply row_parallel_bias(fc2, tp)
        reduce-scatter grad(params) over dp dim=0 op=avg
        '''), encoding="utf-8")
    verdict = check_file(path, cache=False)
    assert verdict.verdict == "verified", verdict.reason


GROUPS = '''
import torch
from torch import nn


class GroupNet(nn.Module):
    WIDTHS = ("width",)

    def __init__(self, groups=4, width=8):
        super().__init__()
        self.up = nn.Linear(4, width * groups, bias=False)  # width outside: groups inner
        self.down = nn.Linear(width * groups, 4, bias=False)

    def input_specs(self, batch, seq):
        return {"inp": ((batch, 4), torch.float32), "tgt": ((batch, 4), torch.float32)}

    def forward(self, inp, tgt):
        e = self.down(torch.tanh(self.up(inp))) - tgt
        return (e * e).mean()
'''


def test_a_users_kept_count_gives_no_credit(tmp_path: Path) -> None:
    """A shipped model's kept count lies outside its widths (DeepSeek's expert groups), so it
    holds a split's factors for them; how a user's model lays its kept fields out is
    unknown, so its declared width keeps the split's factors itself."""
    (tmp_path / "groupnet.py").write_text(GROUPS)
    path = write(tmp_path, "groups", """
        plan groups
        spec "groupnet.py:GroupNet" batch 4 seq 1 groups 4 width 512
        mesh mp=4
        split up.weight [mp, -]
        copy up.in over mp
        split down.weight [-, mp]
        all-reduce down.out over mp
        optimizer sgd lr=0.1
        """)
    overrides, _, _ = sizes(path)
    assert overrides == {"width": 4}
