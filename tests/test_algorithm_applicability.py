"""An `algorithm` statement applies only to a module that computes what the algorithm computes
(docs/semantics.md §7): anything else the module does — a padding row, biases, another
activation, a summed loss, another ignore index — is read from its traced ops and either
honoured or refused with TVP408 at the `algorithm` line, never silently replaced.

Each test is one outside report: the model as the user wrote it is refused (or, where the
algorithm now honours the feature, agrees), and its twin without the feature agrees.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainverify_dsl import api
from trainverify_dsl.api import SimulationSetupError

# -- shared helpers --------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def setup_errors(path: Path) -> list[tuple[str, int, str]]:
    """The diagnostics `tvp simulate` refuses the plan with (code, line, message)."""
    with pytest.raises(SimulationSetupError) as error:
        api.simulate_file(path)
    return [(d.code.id, d.span.line, d.message) for d in error.value.diagnostics]


def line_of(path: Path, start: str) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(start))


def refused(path: Path) -> str:
    """The one TVP408 of the plan, at its `algorithm` line: its message. Both `tvp lint
    --spec` and `tvp simulate` refuse the plan (so `tvp check` never verifies it)."""
    line = line_of(path, "algorithm")
    found = [(d.code.id, d.span.line) for d in api.layout_diagnostics(path)]
    assert found == [("TVP408", line)], found
    [(code, at, message)] = setup_errors(path)
    assert (code, at) == ("TVP408", line)
    return message


# -- 1. vocab-parallel-embedding: nn.Embedding's options ------------------------------------

EMBEDDING_MODEL = '''
import torch
from torch import nn
import torch.nn.functional as F


class PadLM(nn.Module):
    def __init__(self, vocab=16, d=8, f=8, option=0):
        super().__init__()
        kw = [{}, {"padding_idx": 3}, {"max_norm": 1.0}, {"scale_grad_by_freq": True},
              {"sparse": True}][option]
        self.emb = nn.Embedding(vocab, d, **kw)
        self.up = nn.Linear(d, f, bias=False)
        self.gate = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)

    def input_specs(self, batch, seq):
        return {"ids": ((batch, seq), torch.int64), "lbl": ((batch, seq), torch.int64)}

    def forward(self, ids, lbl):
        h = self.emb(ids)
        h = h + self.down(F.silu(self.gate(h)) * self.up(h))
        lp = torch.log_softmax(self.head(h), dim=-1)
        return -lp.gather(-1, lbl.unsqueeze(-1)).squeeze(-1).mean()
'''

EMBEDDING_PLAN = '''plan vp_pad
spec "padlm.py:PadLM" option {option} batch 2 seq 4
spec-optimizer sgd lr=0.1
mesh mp=2

split emb.weight [mp, -]
algorithm vocab-parallel-embedding for emb over mp
all-reduce emb.out over mp

optimizer sgd lr=0.1
'''


@pytest.mark.parametrize("option, said", [
    (1, "padding row (`padding_idx=3`)"),
    (2, "nn.Embedding's `max_norm`"),
    (3, "`scale_grad_by_freq=True`"),
    (4, "`sparse=True`"),
])
def test_vocab_parallel_embedding_refuses_what_nn_embedding_adds(
        tmp_path: Path, option: int, said: str) -> None:
    """Report 1: the padding row got a gradient on every seed that draws its id (the plan was
    verified at seed 0, which does not)."""
    write(tmp_path, "padlm.py", EMBEDDING_MODEL)
    plan = write(tmp_path, "vp.tvp", EMBEDDING_PLAN.format(option=option))
    assert said in refused(plan)


def test_vocab_parallel_embedding_without_options_agrees(tmp_path: Path) -> None:
    write(tmp_path, "padlm.py", EMBEDDING_MODEL)
    plan = write(tmp_path, "vp.tvp", EMBEDDING_PLAN.format(option=0))
    for seed in (0, 2):
        assert api.simulate_file(plan, seed=seed).agrees


# -- 2. context-parallel-attention: projections with biases ---------------------------------

ATTENTION_MODEL = '''
import math
import torch
from torch import nn


def apply_rope(x, cos, sin):
    h = x.shape[-1] // 2
    return torch.cat((x[..., :h] * cos - x[..., h:] * sin,
                      x[..., :h] * sin + x[..., h:] * cos), -1)


def split_heads(x, n):
    b, s, w = x.shape
    return x.view(b, s, n, w // n).transpose(1, 2)


def merge_heads(x):
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d)


def repeat_kv(x, n):
    return x


class Attention(nn.Module):
    def __init__(self, d, heads, bias):
        super().__init__()
        self.heads = heads
        self.scale = 1.0 / math.sqrt(d // heads)
        self.wq = nn.Linear(d, d, bias=bias)
        self.wk = nn.Linear(d, d, bias=bias)
        self.wv = nn.Linear(d, d, bias=bias)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        q = apply_rope(split_heads(self.wq(x), self.heads), cos, sin)
        k = apply_rope(split_heads(self.wk(x), self.heads), cos, sin)
        v = split_heads(self.wv(x), self.heads)
        s = x.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        sc = (torch.matmul(q, k.transpose(-2, -1)) * self.scale).masked_fill(~mask,
                                                                             float("-inf"))
        return self.wo(merge_heads(torch.matmul(torch.softmax(sc, dim=-1), v)))


class Net(nn.Module):
    def __init__(self, vocab=16, d=8, heads=2, maxs=64, bias=1):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.attention = Attention(d, heads, bool(bias))
        self.out = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        freqs = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(maxs, dtype=torch.float64), freqs)
        self.register_buffer("rc", ang.cos().to(torch.get_default_dtype()), persistent=False)
        self.register_buffer("rs", ang.sin().to(torch.get_default_dtype()), persistent=False)

    def input_specs(self, batch, seq):
        return {"inp": ((batch, seq), torch.int64), "tgt": ((batch, seq), torch.int64)}

    def forward(self, inp, tgt):
        s = inp.shape[1]
        h = self.tok(inp)
        h = h + self.attention(h, self.rc[:s], self.rs[:s])
        lp = torch.log_softmax(self.out(h), dim=-1)
        return -lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).mean()
'''

ATTENTION_PLAN = '''plan bias_cp
spec "attn.py:Net" bias {bias} batch 2 seq 8
spec-optimizer sgd lr=0.1
mesh dp=2, cp=2

split inp [dp, cp]
split tgt [dp, cp]

algorithm context-parallel-attention for attention over cp

all-reduce grad(params) over dp, cp op=avg
optimizer sgd lr=0.1
'''


def test_context_parallel_attention_refuses_biases(tmp_path: Path) -> None:
    """Report 2: the biases were dropped (their gradients on no rank, every value off)."""
    write(tmp_path, "attn.py", ATTENTION_MODEL)
    message = refused(write(tmp_path, "cp.tvp", ATTENTION_PLAN.format(bias=1)))
    assert "has biases" in message
    assert all(f"`attention.w{p}.bias`" in message for p in "qkv")


def test_context_parallel_attention_without_biases_agrees(tmp_path: Path) -> None:
    write(tmp_path, "attn.py", ATTENTION_MODEL)
    assert api.simulate_file(write(tmp_path, "cp.tvp", ATTENTION_PLAN.format(bias=0))).agrees


# -- 3. expert-parallel: the experts' activation and roles ----------------------------------

MOE_MODEL = '''
import math
import torch
from torch import nn
import torch.nn.functional as F


class Experts(nn.Module):
    def __init__(self, E, d, f, act):
        super().__init__()
        self.act = act
        self.w1 = nn.Parameter(torch.randn(E, f, d) / math.sqrt(d))
        self.w2 = nn.Parameter(torch.randn(E, d, f) / math.sqrt(f))
        self.w3 = nn.Parameter(torch.randn(E, f, d) / math.sqrt(d))

    def forward(self, x, weights):
        t, d = x.shape
        pe = x.unsqueeze(0).expand(self.w1.shape[0], t, d)
        g = torch.bmm(pe, self.w1.transpose(1, 2))
        u = torch.bmm(pe, self.w3.transpose(1, 2))
        if self.act == 0:
            a = F.silu(g) * u
        elif self.act == 1:
            a = F.gelu(g) * u
        else:  # w3 is the gate: the same ops, the weights in other roles
            a = F.silu(u) * g
        out = torch.bmm(a, self.w2.transpose(1, 2))
        return (out * weights.t().unsqueeze(-1)).sum(dim=0)


class MoE(nn.Module):
    def __init__(self, d, E, k, f, act):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, E, bias=False)
        self.experts = Experts(E, d, f, act)

    def forward(self, x):
        b, s, d = x.shape
        flat = x.reshape(b * s, d)
        probs = torch.softmax(self.router(flat), dim=-1)
        idx = torch.topk(probs.detach(), self.k, dim=-1).indices
        w = probs * torch.zeros_like(probs).scatter(-1, idx, 1.0)
        w = w / w.sum(-1, keepdim=True)
        return self.experts(flat, w).view(b, s, d)


class MoELM(nn.Module):
    def __init__(self, vocab=16, d=8, E=4, k=2, f=4, act=0):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.moe = MoE(d, E, k, f, act)
        self.head = nn.Linear(d, vocab, bias=False)

    def input_specs(self, batch, seq):
        return {"ids": ((batch, seq), torch.int64), "lbl": ((batch, seq), torch.int64)}

    def forward(self, ids, lbl):
        h = self.emb(ids)
        h = h + self.moe(h)
        lp = torch.log_softmax(self.head(h), dim=-1)
        return -lp.gather(-1, lbl.unsqueeze(-1)).squeeze(-1).mean()
'''

MOE_PLAN = '''plan ep
spec "moe.py:MoELM" act {act} batch 4 seq 2
spec-optimizer sgd lr=0.1
mesh dp=2, experts=2
loss-scale 1/(dp*experts)

split ids [(dp, experts), -]
split lbl [(dp, experts), -]
split moe.experts.w1 [experts, -, -]
split moe.experts.w2 [experts, -, -]
split moe.experts.w3 [experts, -, -]
algorithm expert-parallel for moe.experts over experts

all-reduce grad(emb.weight) over dp, experts
all-reduce grad(moe.router.weight) over dp, experts
all-reduce grad(head.weight) over dp, experts
all-reduce grad(moe.experts.w?) over dp
optimizer sgd lr=0.1
'''


@pytest.mark.parametrize("act, said", [
    (1, "the module computes aten.gelu where the algorithm computes aten.mul, aten.sigmoid"),
    (2, "combines the same ops differently"),
])
def test_expert_parallel_refuses_other_experts(tmp_path: Path, act: int, said: str) -> None:
    """Report 3: GELU experts were run as SiLU ones. The weights' names bind them, but their
    roles are read from the traced ops: a model gating with `w3` is refused too."""
    write(tmp_path, "moe.py", MOE_MODEL)
    assert said in refused(write(tmp_path, "ep.tvp", MOE_PLAN.format(act=act)))


def test_expert_parallel_on_swiglu_experts_agrees(tmp_path: Path) -> None:
    write(tmp_path, "moe.py", MOE_MODEL)
    assert api.simulate_file(write(tmp_path, "ep.tvp", MOE_PLAN.format(act=0))).agrees


# -- 4 and 5. vocab-parallel-cross-entropy: the loss's reduction and ignore index ------------

LM_MODEL = '''
import torch
from torch import nn
import torch.nn.functional as F


class LM(nn.Module):
    def __init__(self, vocab=16, d=8, lossk=1):
        super().__init__()
        self.lossk, self.vocab = lossk, vocab
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)

    def input_specs(self, batch, seq):
        return {"ids": ((batch, seq), torch.int64), "lbl": ((batch, seq), torch.int64)}

    def forward(self, ids, lbl):
        logits = self.head(torch.tanh(self.mix(self.emb(ids))))
        if self.lossk == 0:  # torch's implicit ignore_index=-100
            return F.cross_entropy(logits.reshape(-1, self.vocab), lbl.reshape(-1))
        if self.lossk == 3:  # an ignore index inside the vocabulary
            return F.cross_entropy(logits.reshape(-1, self.vocab), lbl.reshape(-1),
                                   ignore_index=5)
        nll = -torch.log_softmax(logits, dim=-1).gather(-1, lbl.unsqueeze(-1)).squeeze(-1)
        if self.lossk == 1:
            return nll.mean()
        if self.lossk == 2:
            return nll.sum()
        if self.lossk == 4:
            return 2.0 * nll.mean()
        counted = lbl >= 0  # a token count the algorithm cannot read as an ignore index
        return torch.where(counted, nll, torch.zeros_like(nll)).sum() / counted.sum()
'''

LM_PLAN = '''plan vp_ce
spec "lm.py:LM" lossk {lossk} batch 4 seq 4
spec-optimizer sgd lr=0.1
mesh rep=2, mp=2
{reduction}
split ids [rep, -]
split lbl [rep, -]
split head.weight [mp, -]
copy head.in over mp
algorithm vocab-parallel-cross-entropy for head, loss over mp

all-reduce grad(params) over rep op={op}
optimizer sgd lr=0.1
'''


def lm_plan(tmp_path: Path, lossk: int, reduction: str = "", op: str = "avg") -> Path:
    write(tmp_path, "lm.py", LM_MODEL)
    return write(tmp_path, f"ce{lossk}.tvp",
                 LM_PLAN.format(lossk=lossk, reduction=reduction, op=op))


def test_vocab_parallel_cross_entropy_keeps_a_summed_loss_a_sum(tmp_path: Path) -> None:
    """Report 4: a summed loss was replaced by a mean. Now the algorithm sums as the spec
    does, so a summed loss under the default local-mean is TVP414 at the spec line, as it is
    without the algorithm, and with `loss-reduction sum` the plan agrees."""
    plan = lm_plan(tmp_path, 2)
    assert [(code, line) for code, line, _ in setup_errors(plan)] == [("TVP414", 2)]
    assert [(d.code.id, d.span.line) for d in api.layout_diagnostics(plan)] == [("TVP414", 2)]
    summed = lm_plan(tmp_path, 2, "loss-reduction sum scale=1", "sum")
    assert api.simulate_file(summed).agrees


def test_vocab_parallel_cross_entropy_refuses_a_scaled_loss(tmp_path: Path) -> None:
    assert "is 2 times the cross-entropy" in refused(lm_plan(tmp_path, 4))


def test_vocab_parallel_cross_entropy_of_a_mean_agrees(tmp_path: Path) -> None:
    assert api.simulate_file(lm_plan(tmp_path, 1)).agrees


@pytest.mark.parametrize("lossk", [0, 3])
def test_vocab_parallel_cross_entropy_reads_the_ignore_index_of_the_traced_loss(
        tmp_path: Path, lossk: int) -> None:
    """Report 5: F.cross_entropy's implicit ignore_index=-100 (and an explicit one) is read
    from the traced loss, not from a `config.ignore_index` a user model does not have: under
    token-mean the masked positions drawn by the simulation count as the spec counts them."""
    plan = lm_plan(tmp_path, lossk, "loss-reduction token-mean", "sum")
    for seed in (0, 2):
        assert api.simulate_file(plan, seed=seed).agrees


def test_vocab_parallel_cross_entropy_refuses_a_count_it_cannot_read(tmp_path: Path) -> None:
    message = refused(lm_plan(tmp_path, 5, "loss-reduction token-mean", "sum"))
    assert "divides by a count" in message


# -- row-parallel-linear: a layer that is x Wᵀ + b and nothing else ------------------------

ROW_MODEL = '''
import torch
from torch import nn


class Scaled(nn.Module):
    """A weight and a bias, like nn.Linear, but the product is doubled."""

    def __init__(self, d_in, d_out, scaled):
        super().__init__()
        self.scaled = scaled
        self.weight = nn.Parameter(torch.randn(d_out, d_in) / d_in ** 0.5)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        y = x @ self.weight.t()
        return (2.0 * y if self.scaled else y) + self.bias


class Net(nn.Module):
    def __init__(self, d=8, f=8, scaled=1):
        super().__init__()
        self.fc1 = nn.Linear(d, f, bias=False)
        self.fc2 = Scaled(f, d, scaled)

    def input_specs(self, batch, seq):
        dtype = torch.get_default_dtype()
        return {"x": ((batch, 8), dtype), "target": ((batch, 8), dtype)}

    def forward(self, x, target):
        return ((self.fc2(torch.tanh(self.fc1(x))) - target) ** 2).mean()
'''

ROW_PLAN = '''plan row
spec "row.py:Net" scaled {scaled} batch 4 seq 1
spec-optimizer sgd lr=0.1
mesh tp=2

split fc1.weight [tp, -]
copy fc1.in over tp
split fc2.weight [-, tp]
algorithm row-parallel-linear for fc2 over tp

optimizer sgd lr=0.1
'''


def test_row_parallel_linear_refuses_a_layer_that_is_not_linear(tmp_path: Path) -> None:
    """A module with a weight and a bias was taken for a linear layer by their names."""
    write(tmp_path, "row.py", ROW_MODEL)
    message = refused(write(tmp_path, "row.tvp", ROW_PLAN.format(scaled=1)))
    assert "a linear layer x Wᵀ + b" in message


def test_row_parallel_linear_on_a_linear_layer_agrees(tmp_path: Path) -> None:
    write(tmp_path, "row.py", ROW_MODEL)
    assert api.simulate_file(write(tmp_path, "row.tvp", ROW_PLAN.format(scaled=0))).agrees


SHIPPED_MASKED = '''plan masked_vp_ce
spec "{root}/stdlib/models/llama.py:Llama" config llama_tiny batch 4 seq 8 ignore_index {ignore}
spec-optimizer sgd lr=0.01
mesh rows=2, mp=2
microbatches 2
{reduction}
use "{root}/stdlib/megatron.tvp"

split tokens [rows, -]
split labels [rows, -]
apply vocab_parallel_embedding(embed, mp)
apply vocab_parallel_output(output, mp)

all-reduce grad(params) over rows op={op}
optimizer sgd lr=0.01
'''


def shipped_masked_plan(tmp_path: Path, ignore: int, reduction: str, op: str) -> Path:
    root = Path(__file__).resolve().parent.parent.as_posix()
    return write(tmp_path, f"masked{ignore}{op}.tvp", SHIPPED_MASKED.format(
        root=root, ignore=ignore, reduction=reduction, op=op))


@pytest.mark.parametrize("ignore", [5, -100])
def test_vocab_parallel_cross_entropy_on_the_shipped_masked_loss_agrees(
        tmp_path: Path, ignore: int) -> None:
    """Session 19, outside report: Megatron's per-token loss (the shipped models' `lm_loss`
    with `ignore_index`, token-mean, vocab-parallel cross-entropy) was TVP408 "not
    `-log_softmax(logits)[label]`": the zeros of the loss's mask are traced as `full_like`,
    which the algorithm did not read as zeros. The local-mean twin differs."""
    plan = shipped_masked_plan(tmp_path, ignore, "loss-reduction token-mean", "sum")
    assert [d.code.id for d in api.layout_diagnostics(plan, allow_model_outside_root=True)] \
        == []
    assert api.simulate_file(plan, allow_model_outside_root=True).agrees
    twin = shipped_masked_plan(tmp_path, ignore, "loss-scale 1/microbatches", "avg")
    assert not api.simulate_file(twin, allow_model_outside_root=True).agrees


def test_a_proof_keeps_the_ignored_label(tmp_path: Path) -> None:
    """`ignore_index` is a label value, not a width: the proof's shrunk sizes keep it (it
    was shrunk to 3 beside a vocabulary of 2) and the plan is verified."""
    plan = shipped_masked_plan(tmp_path, 5, "loss-reduction token-mean", "sum")
    verdict = api.check_file(plan, allow_model_outside_root=True, cache=False)
    assert verdict.verdict == "verified", verdict.reason
    sizes = next(a for a in verdict.assumptions if a.startswith("shape reduction"))
    assert "vocab_size=2" in sizes and "ignore_index" not in sizes


def test_context_parallel_attention_refuses_an_attention_without_rope_tables(
        tmp_path: Path) -> None:
    """GPT-2's attention takes only the hidden state (learned positions are added before
    the blocks): the algorithm said TVP401 "the spec model never passes through
    `layers.0.attention.in#1`" at the spec line, a name the plan never wrote."""
    root = Path(__file__).resolve().parents[1]
    path = write(tmp_path, "gpt2_cp.tvp", (
        "plan p\n"
        f'spec "{root}/stdlib/models/gpt2.py:GPT2" config gpt2_tiny batch 4 seq 8\n'
        "mesh dp=2, cp=2\n"
        "split tokens [dp, cp]\nsplit labels [dp, cp]\n"
        "scatter pos_embed.out over cp dim=0\n"
        "algorithm context-parallel-attention for layers.*.attention over cp\n"
        "all-reduce grad(params) over dp, cp op=avg\n"))
    message = refused(path)
    assert "RoPE tables" in message and "not a Llama attention" in message
