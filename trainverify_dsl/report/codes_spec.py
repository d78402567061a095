"""Diagnostic codes of the spec stage (see report/codes.py for id ranges).

The spec stage loads a torch model and traces its training step into the IR. Its examples
are ``spec`` lines of a plan (the model reference is where these problems originate).
"""

from trainverify_dsl.report.diagnostics import Code, Severity

MODEL_NOT_FOUND = Code(
    "TVP301", "model-not-found", Severity.ERROR,
    "the model reference names no file, class or config",
    what="The model reference (`file.py:Class` or a config name from "
         "stdlib/models/configs.json) does not resolve to a model class.",
    why="Without the single-device model there is no spec to prove the plan against.",
    example='spec "stdlib/models/lama.py:Llama" config llama3_8b',
    fix='spec "stdlib/models/llama.py:Llama" config llama3_8b',
)

CONFIG_NOT_FOUND = Code(
    "TVP302", "config-not-found", Severity.ERROR,
    "the model has no config of this name",
    what="The config name is not a key of stdlib/models/configs.json (or the model's "
         "`from_config_name` rejected it).",
    why="Real dimensions come from the config; a misspelt one would trace another model.",
    example='spec "stdlib/models/llama.py:Llama" config llama3_8c',
    fix='spec "stdlib/models/llama.py:Llama" config llama3_8b',
)

MODEL_LOAD_FAILED = Code(
    "TVP303", "model-load-failed", Severity.ERROR,
    "importing or constructing the model raised an exception",
    what="The model file could not be imported, or constructing the model (on fake "
         "tensors) raised an exception, for example a bad config override.",
    why="The model must be constructible with the given config to be traced.",
    example='spec "stdlib/models/llama.py:Llama" config llama3_8b batch 4 seq 8 n_heads 7',
    fix='spec "stdlib/models/llama.py:Llama" config llama3_8b batch 4 seq 8',
)

UNSUPPORTED_OP = Code(
    "TVP304", "unsupported-op", Severity.ERROR,
    "the traced model uses an ATen op the IR cannot express",
    what="After Core-ATen decomposition the training step contains an op with no IR "
         "equivalent (for example complex numbers or `div` with rounding).",
    why="The checker can only prove what the IR expresses; a silently skipped op would make "
        "any verdict meaningless.",
    example="# model code: torch.view_as_complex(x) in the rotary embedding",
    fix="# model code: rotary embedding with real cos/sin and rotate_half",
)

DATA_DEPENDENT_SHAPE = Code(
    "TVP305", "data-dependent-shape", Severity.ERROR,
    "a tensor's shape depends on tensor values",
    what="The model computes a shape from data (`nonzero`, boolean masking, `torch.where` "
         "with one argument) or reads a tensor value in Python (`.item()`, a tensor constant "
         "built in forward), which cannot be traced with static shapes.",
    why="The spec IR has static shapes so that plans can be checked for every input.",
    example="# model code: tokens, slots = torch.where(routing_mask)",
    fix="# model code: dense routing weights via scatter into a [tokens, experts] matrix",
)

TRACE_FAILED = Code(
    "TVP306", "trace-failed", Severity.ERROR,
    "torch could not trace the model's training step",
    what="torch.export or AOTAutograd raised an error while tracing forward and backward on "
         "fake tensors.",
    why="Only a traced step can be compared with the plan.",
    example="# model code: forward returns a tuple instead of the scalar loss",
    fix="# model code: forward(**inputs) returns the scalar loss",
)

BAD_INPUT_SPEC = Code(
    "TVP307", "bad-input-spec", Severity.ERROR,
    "the model's input specs are malformed",
    what="`input_specs(batch, seq)` must map each forward argument name to (shape, dtype), "
         "every size a whole number of at least 1, the dtype a torch dtype the IR has; a "
         "method that raises is reported too. Reported at the `spec` line.",
    why="The tracer builds its example inputs from these specs.",
    example="# in the model file\n"
            "def input_specs(self, batch, seq):\n"
            '    return {"x": (batch, self.d_in)}            # no dtype\n',
    fix="# in the model file\n"
        "def input_specs(self, batch, seq):\n"
        '    return {"x": ((batch, self.d_in), torch.float32)}\n',
)

IR_INVALID = Code(
    "TVP308", "ir-invalid", Severity.ERROR,
    "the traced IR failed verification (an internal error)",
    what="The IR verifier found a node whose type, arity or operands break an invariant.",
    why="The IR is the trusted base of every proof; a malformed IR cannot be checked.",
    example="# an internal error: please report it with the printed IR excerpt",
    fix="# nothing to change in the model; report the bug",
)

BLOCK_REUSE_FALLBACK = Code(
    "TVP309", "block-reuse-fallback", Severity.WARNING,
    "identical layers could not be traced once and reused",
    what="The tracer could not cut the model at its block list (a block returns a tuple, "
         "changes the hidden shape, or gets a gradient-carrying extra input), so it traced "
         "the whole model flat.",
    why="A flat trace of a large model is slow and its proof cannot reuse one block proof.",
    example="# model code: for layer in self.layers: x, aux = layer(x)",
    fix="# model code: for layer in self.layers: x = layer(x)",
)

MODEL_OUTSIDE_ROOT = Code(
    "TVP310", "model-outside-root", Severity.ERROR,
    "the model file lies outside the plan's folder, the project and the stdlib",
    what="The `spec` line names a model file that, with symlinks resolved, is not inside the "
         "plan's folder, the project root or the shipped stdlib. The file is not imported. "
         "Only `tvp lint --spec`, `tvp simulate` and `tvp spec` import model files; plain "
         "`tvp lint`, `tvp fmt` and `tvp explain` never do. For a file you trust, pass "
         "`--allow-model-outside-root` to the command.",
    why="A model file is Python code and importing it runs it: a plan from a pull request "
        "could otherwise run any file on the machine that checks it.",
    example='spec "../../elsewhere/model.py:Net" batch 8 seq 1',
    fix='spec "models/model.py:Net" batch 8 seq 1   # a file beside the plan',
)

SIZE_READ = Code(
    "TVP311", "size-read-as-number", Severity.ERROR,
    "the model computes with a size of its inputs that the plan splits",
    what="The model's arithmetic uses a number read from a tensor's size in Python "
         "(`x.shape[0]`, `len(x)`, `x.numel()`), and the plan splits that dimension (data "
         "ranks, microbatches, context parallelism). The trace records the global size; "
         "each rank of a real run reads its own, smaller one.",
    why="The program checked divides by the global size while the program run divides by "
        "the local one: a plan could be verified and still scale its gradients by the "
        "number of data blocks.",
    example="# model code: return ((self.fc(x) - y) ** 2).sum() / x.shape[0]",
    fix="# model code: return ((self.fc(x) - y) ** 2).sum(-1).mean()",
)

SHRUNK_BELOW_CONSTANT = Code(
    "TVP312", "width-shrunk-below-constant", Severity.ERROR,
    "a width was shrunk below a constant the model compares an input with",
    what="Simulation and `tvp check` run the model at small widths (docs/semantics.md §9). "
         "The model tests an integer input against a constant (a pad label `tgt != 3`) and "
         "indexes a table with the input where that test masks it, but after shrinking the "
         "table has fewer rows than the constant: the masked entries cannot be drawn, and a "
         "step at the shrunk widths is not the model's step.",
    why="A width a model lists in `WIDTHS` must be used only as a size: a pad label inside "
        "the vocabulary ties a constant to it. Dropping the masked entries would test the "
        "step without its padding, the case a token-count plan gets wrong.",
    example='class Net(nn.Module):\n    WIDTHS = ("vocab", "hidden")   # the loss masks `tgt != 3`',
    fix='class Net(nn.Module):\n    WIDTHS = ("hidden",)           # vocab kept at its size',
)

FIXED_COUNT_ALONG_SPLIT = Code(
    "TVP313", "fixed-count-along-split", Severity.ERROR,
    "a view fixes a count along a dimension the plan splits",
    what="A `view` or `reshape` of the model cuts a dimension that grows with the inputs "
         "(the batch, the sequence) into a fixed number of groups (`h.view(2, -1, d)`), and "
         "the plan splits that dimension (data ranks, microbatches, context parallelism). "
         "The checked program gives the view its local sizes, so each rank holds the spec's "
         "groups; each rank of a real run runs the model's code and cuts its own rows into "
         "that many groups.",
    why="Ghost batch norm with a fixed number of virtual batches, a softmax over `reshape(4, "
        "-1)`: on a rank with half the rows every group is half as large, and statistics or "
        "normalisations over a group differ from the single-device step. The plan would be "
        "verified and the run would train another model.",
    example="# model code: g = h.view(2, -1, d)       # two groups of rows",
    fix="# model code: g = h.view(-1, 4, d)       # groups of four rows, on any rank",
)

FROZEN_PARAMETER = Code(
    "TVP314", "frozen-parameter", Severity.ERROR,
    "a parameter of the model does not require a gradient",
    what="A parameter of the spec model has `requires_grad=False` (frozen, as in a partly "
         "fine-tuned model). The training step the checker compares gives every parameter "
         "a gradient, its gradient statements and an optimizer update.",
    why="A frozen parameter has no gradient in the single-device step, so `grad(params)` and "
        "the optimizer would name a value that does not exist; frozen weights are not "
        "supported yet, and guessing what the plan means for them could hide a bug.",
    example="# model code: self.scale = nn.Parameter(torch.ones(d), requires_grad=False)",
    fix='# model code: self.register_buffer("scale", torch.ones(d))   # a constant',
)

UNUSABLE_NAME = Code(
    "TVP315", "unusable-name", Severity.ERROR,
    "a parameter or buffer named with a Python keyword, or a name `loss`",
    what="A parameter or buffer of the spec model has a Python keyword as a part of its name "
         "(`self.register_parameter(\"in\", ...)`), which torch.export cannot trace, or a "
         "parameter, buffer, model input or top-level submodule is named `loss`, the name "
         "plans and the training-step IR give the step's loss.",
    why="The first ended in an internal error inside torch; the second in an IR error about "
        "`loss` being defined twice. Neither says that the name is the problem.",
    example='# model code: self.register_parameter("in", nn.Parameter(torch.ones(d)))',
    fix='# model code: self.register_parameter("w_in", nn.Parameter(torch.ones(d)))',
)

CODES: tuple[Code, ...] = (
    MODEL_NOT_FOUND, CONFIG_NOT_FOUND, MODEL_LOAD_FAILED, UNSUPPORTED_OP,
    DATA_DEPENDENT_SHAPE, TRACE_FAILED, BAD_INPUT_SPEC, IR_INVALID, BLOCK_REUSE_FALLBACK,
    MODEL_OUTSIDE_ROOT, SIZE_READ, SHRUNK_BELOW_CONSTANT, FIXED_COUNT_ALONG_SPLIT,
    FROZEN_PARAMETER, UNUSABLE_NAME,
)
