"""Symmetry (``check/symmetry.py``): identical blocks proven once.

- On Llama plans with several identical middle blocks (data and tensor parallel; a pipeline
  with microbatches), the proof merges the middle blocks' stages, and what it skips is
  exactly what the representatives stand for: the elements compared plus the elements
  covered by symmetry equal the elements the proof without symmetry compares, and both are
  proven.
- A block whose plan statements differ from the others' is a class of its own (proven
  itself), end to end.
- Each part of the canonical form keeps a block apart when it differs: a gradient statement
  on one block's parameter, one parameter's layout, the optimizer's update graph for one
  parameter, the reference's call for one block, a claim on one block's tensor.
- Nothing is merged with gradient clipping or per-rank optimizer overrides; a block that
  orders computed values (top-k routing) merges, proven under its representative's drawn
  routing, and the verdict says so; the verdict names the merge.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.check import prove as prove_module
from trainverify_dsl.check import stages, symmetry
from trainverify_dsl.check.prove import prove
from trainverify_dsl.check.stages import numeric_values, plan_cuts
from trainverify_dsl.check.verdict import VERIFIED
from trainverify_dsl.ir.compare import Comparison
from trainverify_dsl.ir.parallel import Claim, GradSync

ROOT = Path(__file__).resolve().parents[1]
TP_LAYER = ["    apply attention_parallel({l}.attention, tp)",
            "    apply column_parallel({l}.feed_forward.w1, tp)",
            "    apply column_parallel({l}.feed_forward.w3, tp)",
            "    split {l}.feed_forward.w2.weight [-, tp]",
            "    all-reduce {l}.feed_forward.w2.out over tp"]


def llama(layers: int, pp: int = 1, microbatches: int = 1,
          replicated_ffn: int | None = None) -> str:
    """Llama tiny on dp=2, tp=2 (and pp), every block tensor parallel; block
    ``replicated_ffn`` keeps its feed-forward replicated (a correct plan too)."""
    mesh = (f"pp={pp}, " if pp > 1 else "") + "dp=2, tp=2"
    lines = ["plan sym",
             f'spec "{ROOT}/stdlib/models/llama.py:Llama" config llama_tiny '
             f"batch {4 * microbatches} seq 8 n_layers {layers}",
             "spec-optimizer sgd lr=0.01", f"mesh {mesh}", f"microbatches {microbatches}",
             "loss-scale 1/microbatches", f'use "{ROOT}/stdlib/megatron.tvp"', "",
             "split tokens [dp, -]", "split labels [dp, -]"]
    if pp > 1:
        per = layers // pp
        for s in range(pp):
            members = [f"layers[{s * per}:{(s + 1) * per}]"]
            members = (["embed"] if s == 0 else []) + members + \
                (["norm", "output", "loss"] if s == pp - 1 else [])
            lines.append(f"pipeline-stage {s}: {', '.join(members)}")
    if replicated_ffn is None:
        lines += ["for l in layers:"] + [t.format(l="l") for t in TP_LAYER]
    else:
        for k in range(layers):
            body = TP_LAYER[:1] if k == replicated_ffn else TP_LAYER
            lines += [t.format(l=f"layers.{k}").strip() for t in body]
    lines += ["", "all-reduce grad(params) over dp op=avg", "optimizer sgd lr=0.01"]
    return "\n".join(lines) + "\n"


def pair_and_cuts(tmp_path: Path, text: str):
    path = tmp_path / "plan.tvp"
    path.write_text(text)
    built = api.build_programs(path, shrink=True, blocks=True, allow_model_outside_root=True)
    values = api.step_values(built.program, built.spec, built.setup.build_real(), 0)
    pair = api.check_pair(built, values)
    drawn = numeric_values(pair.inputs, pair.known, pair.witness)
    cuts, _ = plan_cuts(pair.reference, pair.program, pair.boundaries, drawn)
    return pair, cuts


@pytest.fixture(scope="module")
def five(tmp_path_factory: pytest.TempPathFactory):
    """5 blocks, dp=2, tp=2: stage 0 is the embedding, stages 1 to 5 the blocks (one form,
    the first and last blocks too: every block boundary has one name), stage 6 the head."""
    return pair_and_cuts(tmp_path_factory.mktemp("five"), llama(5))


def test_identical_blocks_are_merged_and_cover_what_they_skip(five) -> None:
    pair, cuts = five
    classes = symmetry.find(pair, cuts)
    assert classes is not None
    assert classes.classes == ((1, (2, 3, 4, 5)),)
    assert classes.skipped_stages == {2, 3, 4, 5}
    merged, whole = prove(pair), prove(pair, symmetric=False)
    assert merged.status == whole.status == "proven", (merged.reason, whole.reason)
    assert merged.merged == 4 and whole.merged == 0
    assert merged.elements + merged.by_symmetry == whole.elements
    assert merged.elements < whole.elements
    assert merged.term_count < whole.term_count


@pytest.mark.slow
def test_pipeline_blocks_on_other_ranks_are_merged(tmp_path: Path) -> None:
    """pp=2, 2 microbatches, 6 blocks: the blocks of both pipeline places merge (the
    embedding and the head are stages of their own)."""
    pair, cuts = pair_and_cuts(tmp_path, llama(6, pp=2, microbatches=2))
    classes = symmetry.find(pair, cuts)
    assert classes is not None and classes.classes == ((1, (2, 3, 4, 5, 6)),)
    merged, whole = prove(pair), prove(pair, symmetric=False)
    assert merged.status == whole.status == "proven"
    assert merged.elements + merged.by_symmetry == whole.elements


def test_a_block_with_other_statements_is_its_own_class(tmp_path: Path) -> None:
    pair, cuts = pair_and_cuts(tmp_path, llama(5, replicated_ffn=2))
    classes = symmetry.find(pair, cuts)
    assert classes is not None and classes.classes == ((1, (2, 4, 5)),)  # block 2: stage 3
    path = tmp_path / "plan.tvp"
    verdict = api.check_file(path, cache=False, allow_model_outside_root=True)
    assert verdict.verdict == VERIFIED, verdict.reason
    assert (verdict.stages_total, verdict.stages_unique, verdict.stages_proven) == (7, 4, 7)
    assert "proven by symmetry" in verdict.reason
    assert any(n.startswith("symmetry: 3 block stages") for n in verdict.notes)


@pytest.mark.slow
def test_moe_blocks_with_top_k_routing_merge_under_their_representatives_routing(
        tmp_path: Path) -> None:
    """Session 28: every DeepSeek MoE block orders its router's scores, so no MoE block
    merged and the paper plans' symbolic step grew with their layer count. Now they merge
    (``deepseek_tiny_ep`` at 4 blocks: blocks 2 and 3 proven by block 1's proof), and the
    verdict says whose drawn routing the merged blocks are proven under."""
    text = (ROOT / "plans" / "deepseek_tiny_ep.tvp").read_text()
    text = text.replace('"stdlib/', f'"{ROOT}/stdlib/').replace(
        "batch 4 seq 8", "batch 4 seq 8 n_layers 4").replace("layers[1:3]", "layers[1:4]")
    path = tmp_path / "plan.tvp"
    path.write_text(text)
    verdict = api.check_file(path, cache=False, allow_model_outside_root=True)
    assert verdict.verdict == VERIFIED, verdict.reason
    assert (verdict.stages_total, verdict.stages_unique) == (6, 4)
    assert any("representative's drawn routing" in a for a in verdict.assumptions)


def _block_param(pair, block: int) -> str:
    return next(p for p, _ in pair.program.param_layouts
                if p.startswith(f"layers.{block}.feed_forward.w1"))


def _sync_on_one(pair):
    param = _block_param(pair, 3)
    extra = GradSync("all_reduce", ("tp",), "sum", 0, (param,),
                     pair.program.grad_syncs[0].origin)
    return dataclasses.replace(pair, program=dataclasses.replace(
        pair.program, grad_syncs=pair.program.grad_syncs + (extra,)))


def _layout_of_one(pair):
    param = _block_param(pair, 3)
    layouts = tuple((p, dataclasses.replace(lay, const=True) if p == param else lay)
                    for p, lay in pair.program.param_layouts)
    return dataclasses.replace(pair, program=dataclasses.replace(
        pair.program, param_layouts=layouts))


def _update_of_one(pair):
    """One parameter's update graph with another attribute on its first node."""
    param = _block_param(pair, 3)
    opt = pair.program.optimizer
    target = next(u for u in opt.updates if u.param == param)
    node = target.graph.nodes[0]
    nodes = (node.replace(attrs=tuple(node.attrs) + (("tag", 1),)),) + target.graph.nodes[1:]
    graph = dataclasses.replace(target.graph, nodes=nodes)
    updates = tuple(dataclasses.replace(u, graph=graph) if u is target else u
                    for u in opt.updates)
    return dataclasses.replace(pair, program=dataclasses.replace(
        pair.program, optimizer=dataclasses.replace(opt, updates=updates)))


def _reference_call_of_one(pair):
    calls = tuple(dataclasses.replace(c, args=tuple(reversed(c.args)))
                  if c.prefix == "layers.3" and c.label.endswith("forward") else c
                  for c in pair.reference.calls)
    return dataclasses.replace(pair, reference=dataclasses.replace(pair.reference,
                                                                   calls=calls))


def _claim_on_one(pair):
    """A claim on a point block 3's stage observes (only there)."""
    stage = pair.program.stages[4]
    slot = next(s for s in stage.outputs if s.kind == "lineage")
    claim = Claim(slot.spec, slot.layout, pair.program.grad_syncs[0].origin)
    return dataclasses.replace(pair, program=dataclasses.replace(
        pair.program, claims=pair.program.claims + (claim,)))


@pytest.mark.parametrize("mutate", [_sync_on_one, _layout_of_one, _update_of_one,
                                    _reference_call_of_one, _claim_on_one],
                         ids=["gradient statement", "parameter layout", "update graph",
                              "reference call", "claim"])
def test_a_difference_in_any_part_of_the_form_keeps_the_block_apart(five, mutate) -> None:
    pair, cuts = five
    changed = mutate(pair)
    classes = symmetry.find(changed, cuts)
    assert classes is not None
    assert 4 not in classes.skipped_stages  # block 3
    assert classes.classes == ((1, (2, 3, 5)),)


def test_clipping_and_overrides_stop_every_merge_and_an_ordering_is_named(five,
                                                                         monkeypatch) -> None:
    """Session 28: a block that orders computed values (top-k routing) merges, and the
    symmetry says so (``ordered``: the merged block is proven under its representative's
    drawn routing, which the verdict states)."""
    pair, cuts = five
    program = pair.program
    clipped = dataclasses.replace(pair, program=dataclasses.replace(program, clip=object()))
    assert symmetry.find(clipped, cuts) is None
    opt = dataclasses.replace(program.optimizer, overrides=(object(),))
    overridden = dataclasses.replace(pair, program=dataclasses.replace(program, optimizer=opt))
    assert symmetry.find(overridden, cuts) is None
    op = program.stages[1].graph.nodes[-1].op
    assert not symmetry.find(pair, cuts).ordered
    monkeypatch.setattr(symmetry, "ORDERINGS", {op: None})
    ordered = symmetry.find(pair, cuts)
    assert ordered is not None and ordered.ordered
    assert ordered.classes == symmetry.find(pair, cuts).classes


def test_a_cut_next_to_a_merged_block_keeps_its_obligations(five, monkeypatch) -> None:
    """Every cotangent ratio off by a factor of 3: the cut between the last merged block
    (stage 5, block 4) and the head is computed by the head's stage, which runs, so its
    obligations stay (a merged block's name prefix covers its final checks, never a cut's),
    fail, and the cut proof is not ``proven``."""
    pair, cuts = five
    wrong = [stages.Cut(c.point, c.boundary, c.transfers, c.layout, c.cotangent_layout,
                        c.scale * 3) for c in cuts]
    monkeypatch.setattr(stages, "plan_cuts", lambda *args: (wrong, {}))
    cut = prove_module._prove_cut(pair, 2.0, lambda phase: None, None)
    assert cut is not None and cut.merged == 4
    assert cut.status != "proven" and cut.cuts_unproven > 0
    classes = symmetry.find(pair, cuts)
    assert not classes.covers(Comparison(stages.CHECK, "layers.4.out (cotangent x 2)", 0,
                                         None))
    assert classes.covers(Comparison("gradients", "grad(layers.3.ffn_norm.weight)", 0, None))
