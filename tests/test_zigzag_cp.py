"""Zigzag (load-balanced) context parallelism (docs/semantics.md §2.6 and §7.4).

- the zigzag blocks of ``ir/layout.py``: block ``k`` of ``N`` holds chunks ``k`` and
  ``2N-1-k`` of ``2N``, the blocks tile the dimension, and reshapes keep the pieces;
- the project's ``context_parallel_attention`` with ``zigzag=True``, run per rank as threads
  with the eager collectives, against torch's Llama attention on the whole sequence (outputs
  and the gradients of the input and of every weight, to 1e-12), and the contiguous positions
  on zigzag data (the bug of ``plans/bugs/zigzag_rope_contiguous.tvp``) differing from it;
- diagnostics for misuse: a sequence not divisible by ``2N``, an unknown order, zigzag on the
  batch or on a parameter, a collective along a zigzag dimension, an algorithm whose order
  cannot cut the local positions, a claim in the wrong order — each at its line, never a
  traceback — and a claim in zigzag order that holds.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trainverify_dsl.api import SimulationSetupError, simulate_file
from trainverify_dsl.cli.main import main
from trainverify_dsl.ir.layout import (
    Factor,
    LayoutError,
    TLayout,
    block_indices,
    local_indices,
    reshape_dims,
    take_local,
)
from trainverify_dsl.lower.algorithms import context_parallel_attention, sequence_positions
from trainverify_dsl.lower.collectives import ThreadWorld, run_threads
from trainverify_dsl.plan import lint_file

pytestmark = pytest.mark.usefixtures("float64")

ROOT = Path(__file__).resolve().parent.parent
TIGHT = {"rtol": 1e-12, "atol": 1e-12}


# ---------------------------------------------------------------- the blocks


@pytest.mark.parametrize("n, size", [(1, 4), (2, 8), (2, 4), (3, 12), (4, 16)])
def test_zigzag_block_k_holds_chunks_k_and_its_mirror(n: int, size: int) -> None:
    f = Factor(size, ("cp",), zigzag=True)
    chunk = size // (2 * n)
    blocks = [block_indices(f, k, n) for k in range(n)]
    for k, block in enumerate(blocks):
        want = list(range(k * chunk, (k + 1) * chunk)) + \
            list(range((2 * n - 1 - k) * chunk, (2 * n - k) * chunk))
        assert block.tolist() == want
    assert sorted(np.concatenate(blocks).tolist()) == list(range(size))


def test_the_example_of_the_semantics() -> None:
    """§2.6: `seq 8`, `cp = 2`: rank 0 holds positions 0, 1, 6, 7 and rank 1 positions 2..5."""
    f = (Factor(8, ("cp",), zigzag=True),)
    assert local_indices(f, {"cp": 0}, {"cp": 2}).tolist() == [0, 1, 6, 7]
    assert local_indices(f, {"cp": 1}, {"cp": 2}).tolist() == [2, 3, 4, 5]
    assert sequence_positions(torch.tensor(0), 2, 4, True).tolist() == [0, 1, 6, 7]
    assert sequence_positions(torch.tensor(1), 2, 4, False).tolist() == [4, 5, 6, 7]


@given(dp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2, 3]),
       chunk=st.integers(1, 3), heads=st.sampled_from([1, 2, 3]), width=st.integers(1, 3))
def test_reshape_of_a_zigzag_dimension_keeps_the_pieces(dp: int, cp: int, chunk: int,
                                                        heads: int, width: int) -> None:
    """Splitting the hidden dimension into heads, or merging batch and sequence, moves whole
    zigzag chunks: the layout ``reshape_dims`` derives carves the reshaped spec value into the
    reshape of each rank's piece."""
    sizes = {"dp": dp, "cp": cp}
    b, s, h = 2 * dp, 2 * cp * chunk, heads * width
    lay = TLayout(((Factor(b, ("dp",)),), (Factor(s, ("cp",), zigzag=True),), (Factor(h),)))
    x = np.arange(b * s * h, dtype=float).reshape(b, s, h)
    for shape in [(b, s, heads, width), (b * s, h), (b, s * h)]:
        dims = reshape_dims(lay.dims, shape, sizes)
        for d in range(dp):
            for c in range(cp):
                coords = {"dp": d, "cp": c}
                piece = take_local(x, lay, coords, sizes)
                local = TLayout(dims).local_shape(sizes)
                assert np.array_equal(take_local(x.reshape(shape), TLayout(dims), coords, sizes),
                                      piece.reshape(local))


def test_a_reshape_cutting_inside_a_zigzag_chunk_is_refused() -> None:
    """`[8/zigzag(cp)]` with `cp = 2` has chunks of 2: a `[2, 4]` view would cut them."""
    with pytest.raises(LayoutError, match="two zigzag chunks per block"):
        reshape_dims(((Factor(8, ("cp",), zigzag=True),),), (2, 4), {"cp": 2})
    assert TLayout(((Factor(8, ("cp",), zigzag=True),),)).describe() == "[8/zigzag(cp)]"


# ---------------------------------------------------------------- the attention, against torch


def llama_attention():
    """Llama tiny's attention (4 query heads, 2 key/value heads, head_dim 8) and RoPE tables."""
    from stdlib.models.common import rope_tables
    from stdlib.models.llama import Attention, LlamaConfig

    config = LlamaConfig(vocab_size=64, hidden=32, n_layers=1, n_heads=4, n_kv_heads=2,
                         ffn_hidden=48, max_seq_len=32)
    cos, sin = rope_tables(config.head_dim, 32, config.rope_theta)
    return Attention(config), cos, sin


def run_ranks(attention, cos, sin, x, cot, cp: int, data_zigzag: bool, algorithm_zigzag: bool):
    """Each cp rank runs the project's algorithm on the positions the data layout gives it;
    returns per rank (its global positions, output, input gradient, weight gradients)."""
    seq = x.shape[1]
    helpers = inspect.getmodule(type(attention))
    weights = [m.weight for m in (attention.wq, attention.wk, attention.wv, attention.wo)]
    factor = Factor(seq, ("cp",), zigzag=data_zigzag)

    def step(rank: int):
        index = torch.as_tensor(block_indices(factor, rank, cp))
        local_x = x.detach()[:, index].clone().requires_grad_()
        local_w = [w.detach().clone().requires_grad_() for w in weights]
        out = context_parallel_attention(local_x, cos[:seq], sin[:seq], *local_w,
                                         torch.tensor(rank), ("cp",), cp,
                                         float(attention.scale), helpers, algorithm_zigzag)
        out.backward(cot[:, index])
        return index, out.detach(), local_x.grad, [w.grad for w in local_w]

    return run_threads(ThreadWorld((("cp", cp),)), step)


@pytest.mark.parametrize("cp, seq", [(2, 8), (3, 12), (2, 4)])
def test_zigzag_attention_equals_torch_on_the_whole_sequence(cp: int, seq: int) -> None:
    attention, cos, sin = llama_attention()
    x = torch.randn(2, seq, attention.wq.in_features, requires_grad=True)
    cot = torch.randn(2, seq, attention.wo.out_features)
    spec = attention(x, cos[:seq], sin[:seq])
    spec.backward(cot)
    ranks = run_ranks(attention, cos, sin, x, cot, cp, data_zigzag=True, algorithm_zigzag=True)
    out = torch.empty_like(spec)
    grad_x = torch.empty_like(x)
    for index, local, local_grad, _ in ranks:
        out[:, index], grad_x[:, index] = local, local_grad
    torch.testing.assert_close(out, spec.detach(), **TIGHT)
    torch.testing.assert_close(grad_x, x.grad, **TIGHT)
    # a weight's gradient sums the ranks' positions: Partial(sum) over cp, reduced by the
    # plan's `all-reduce grad(params) over dp, cp`
    modules = (attention.wq, attention.wk, attention.wv, attention.wo)
    for i, module in enumerate(modules):
        total = sum(r[3][i] for r in ranks)
        torch.testing.assert_close(total, module.weight.grad, **TIGHT)
    # the load balance zigzag exists for: every rank's queries see the same number of keys
    allowed = [sum(int(p) + 1 for p in index) for index, *_ in ranks]
    assert len(set(allowed)) == 1


def test_contiguous_positions_on_zigzag_data_differ_from_torch() -> None:
    """The bug of plans/bugs/zigzag_rope_contiguous.tvp: the loader feeds zigzag chunks, the
    attention rotates and masks them as a contiguous block."""
    attention, cos, sin = llama_attention()
    seq, cp = 8, 2
    x = torch.randn(1, seq, attention.wq.in_features)
    cot = torch.randn(1, seq, attention.wo.out_features)
    spec = attention(x, cos[:seq], sin[:seq]).detach()
    for algorithm_zigzag in (False, True):
        ranks = run_ranks(attention, cos, sin, x, cot, cp, True, algorithm_zigzag)
        out = torch.empty_like(spec)
        for index, local, *_ in ranks:
            out[:, index] = local
        assert torch.allclose(out, spec, rtol=1e-12, atol=1e-12) == algorithm_zigzag
    # the reverse (contiguous data, zigzag attention) is wrong too
    ranks = run_ranks(attention, cos, sin, x, cot, cp, False, True)
    out = torch.cat([local for _, local, *_ in ranks], dim=1)
    assert not torch.allclose(out, spec)


# ---------------------------------------------------------------- diagnostics

HEAD = ('plan z\nspec "stdlib/models/llama.py:Llama" config llama_tiny batch 4 seq {seq}\n'
        "spec-optimizer sgd lr=0.01\nmesh dp=2, cp={cp}\n")
TAIL = "all-reduce grad(params) over dp, cp op=avg\noptimizer sgd lr=0.01\n"
ZIGZAG_DATA = "split tokens [dp, zigzag(cp)]\nsplit labels [dp, zigzag(cp)]\n"
ATTENTION = "algorithm context-parallel-attention for layers.*.attention over cp order=zigzag\n"


def write(tmp_path: Path, body: str, seq: int = 8, cp: int = 2) -> Path:
    path = tmp_path / "plan.tvp"
    path.write_text(HEAD.format(seq=seq, cp=cp) + body + TAIL)
    return path


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def lint_codes(path: Path) -> list[tuple[str, int]]:
    return [(d.code.id, d.span.line) for d in lint_file(path, project_root=ROOT)]


def setup_errors(path: Path) -> list[tuple[str, int]]:
    with pytest.raises(SimulationSetupError) as error:
        simulate_file(path)
    assert all(d.span is not None for d in error.value.diagnostics)
    return [(d.code.id, d.span.line) for d in error.value.diagnostics]


@pytest.mark.parametrize("seq, cp", [(6, 2), (9, 3), (12, 4)])
def test_a_sequence_not_divisible_by_twice_the_ranks_is_a_lint_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], seq: int, cp: int) -> None:
    path = write(tmp_path, ZIGZAG_DATA + ATTENTION, seq=seq, cp=cp)
    assert lint_codes(path) == [("TVP234", 5), ("TVP234", 6)]
    assert main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:5:1: error: layout of 'tokens' does not divide evenly" in out
    assert f"cuts it into 2 x {cp} = {2 * cp} chunks, but {2 * cp} does not evenly divide " \
           f"{seq}" in out
    assert "Traceback" not in out


def test_an_unknown_order_is_named_with_a_suggestion(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "split tokens [dp, zigzg(cp)]\nsplit labels [dp, zigzag(cp)]\n"
                 + ATTENTION)
    assert main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:5:19: error: unknown block order 'zigzg'; did you mean 'zigzag'? " \
           "[TVP237]" in out


def test_zigzag_on_the_batch_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "split tokens [zigzag(dp), cp]\nsplit labels [dp, cp]\n")
    assert lint_codes(path) == [("TVP237", 5)]


def test_zigzag_on_a_parameter_is_refused_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, ZIGZAG_DATA + "split layers.0.attention.wq.weight [zigzag(cp), -]\n"
                 + ATTENTION)
    assert lint_codes(path) == []  # lint cannot tell a parameter from an activation
    assert setup_errors(path) == [("TVP237", 7)]


def test_an_all_gather_along_a_zigzag_dimension_has_no_layout(tmp_path: Path) -> None:
    path = write(tmp_path, ZIGZAG_DATA + "all-gather layers.0.attention_norm.out over cp dim=1\n"
                 + ATTENTION)
    assert setup_errors(path) == [("TVP403", 7)]


def test_an_algorithm_order_that_cannot_cut_the_local_positions(tmp_path: Path) -> None:
    """Contiguous data, 3 positions per rank: zigzag chunks of 1.5 positions do not exist."""
    path = write(tmp_path, "split tokens [dp, cp]\nsplit labels [dp, cp]\n" + ATTENTION,
                 seq=9, cp=3)
    assert setup_errors(path) == [("TVP408", 7)]


def test_an_unknown_algorithm_order_is_a_lint_error(tmp_path: Path) -> None:
    path = write(tmp_path, ZIGZAG_DATA + ATTENTION.replace("order=zigzag", "order=balanced"))
    assert lint_codes(path) == [("TVP255", 7)]


def test_a_contiguous_claim_on_zigzag_activations_contradicts_the_layout(tmp_path: Path) -> None:
    path = write(tmp_path, ZIGZAG_DATA + ATTENTION + "split layers.0.out [dp, cp, -]\n")
    assert setup_errors(path) == [("TVP407", 8)]


def test_a_zigzag_claim_on_activations_is_compared_in_sequence_order(tmp_path: Path) -> None:
    """The pieces at `layers.1.out` hold positions in zigzag order; the claim carves the
    spec's value the same way, so it holds (and is compared: a third of the positions would
    not match if the comparison ignored the order)."""
    path = write(tmp_path, ZIGZAG_DATA + ATTENTION + "split layers.1.out [dp, zigzag(cp), -]\n")
    result = simulate_file(path)
    assert result.agrees, result.mismatches[:3]
    assert not result.findings


def test_the_mismatched_order_is_reported_at_the_algorithm(tmp_path: Path) -> None:
    path = write(tmp_path, ZIGZAG_DATA + ATTENTION.replace(" order=zigzag", ""))
    result = simulate_file(path)
    assert not result.agrees
    first = result.first
    assert first is not None and first.tensor == "layers.0.attention.out"
    assert first.span is not None and first.span.line == line_of(path, "algorithm")
    assert "zigzag(cp)" in first.detail


def test_per_token_layers_are_blind_to_the_order(tmp_path: Path) -> None:
    """A per-position two-layer net on zigzag data agrees with the spec (the mean loss does
    not depend on the order of the positions), and a zigzag claim on its activation holds."""
    path = tmp_path / "mlp.tvp"
    path.write_text('plan t\nspec "tests/models/tiny_nets.py:TwoLinear" batch 4 seq 4\n'
                    "spec-optimizer sgd lr=0.1\nmesh dp=2, tp=2\n"
                    "split x [dp, zigzag(tp), -]\nsplit target [dp, zigzag(tp), -]\n"
                    "split fc1.out [dp, zigzag(tp), -]\n"
                    "all-reduce grad(params) over dp, tp op=avg\noptimizer sgd lr=0.1\n")
    result = simulate_file(path)
    assert result.agrees and not result.findings
    assert result.compared > 2 * result.ranks


def test_zigzag_data_without_the_algorithm_has_no_local_attention(tmp_path: Path) -> None:
    """As plans/bugs/rope_not_offset.tvp: the softmax would run along keys split over cp."""
    path = write(tmp_path, ZIGZAG_DATA)
    assert setup_errors(path) == [("TVP403", 5)]
