"""Diagnostic codes of the plan stage (see report/codes.py for id ranges).

TVP200-209 headers and mesh, 210-229 imports, templates and expressions, 230-239 layouts,
240-249 pipeline, 250-259 step settings and optimizer, 260-269 statement options and names.
Every ``example`` is a complete plan that produces its code; every ``fix`` lints clean.
Examples that need a second file (TVP201, TVP211) name it in ``what``.
"""

from trainverify_dsl.report.diagnostics import Code, Severity

_HEAD = (
    "plan demo\n"
    'spec "stdlib/models/llama.py:Llama" config llama_tiny batch 8 seq 16 n_layers 4\n'
)
_MESH = "mesh dp=2, tp=2\n"


def _code(id: str, name: str, summary: str, what: str, why: str, example: str, fix: str,
          severity: Severity = Severity.ERROR) -> Code:
    return Code(id, name, severity, summary, what, why, example, fix)


# ---------------------------------------------------------------- headers and mesh

MISSING_PLAN_HEADER = _code(
    "TVP200", "missing-plan-header", "a main plan file has no `plan NAME` line",
    "The file given to the tool has a `spec` or `mesh` but no `plan NAME` header. (A file "
    "with neither, such as a template library, may be linted alone.)",
    "Fragments are meant to be `use`d; checking one alone usually means the wrong file.",
    _MESH,
    "plan demo\n" + _MESH,
)
PLAN_HEADER_IN_FRAGMENT = _code(
    "TVP201", "plan-header-in-fragment", "a `use`d file has a `plan NAME` line",
    "A file included with `use` starts with `plan NAME`. The example needs a second file "
    "`frag.tvp` holding `plan other`.",
    "Only the main file names the plan; a header in a fragment means two plans were mixed.",
    _HEAD + _MESH + 'use "frag.tvp"\n',
    _HEAD + _MESH,
)
REPEATED_HEADER = _code(
    "TVP202", "repeated-header", "a header statement appears twice",
    "`plan`, `spec`, `microbatches`, `loss-scale`, `optimizer` or `clip-grad-norm` is stated "
    "more than once.",
    "Only the first would count; the second is almost always a stale copy.",
    _HEAD + _MESH + "microbatches 2\nmicrobatches 4\n",
    _HEAD + _MESH + "microbatches 4\n",
)
MISSING_MESH = _code(
    "TVP203", "missing-mesh", "the plan declares no mesh",
    "A main plan file (with its `use`d fragments) has no `mesh` statement.",
    "Without a mesh no layout, collective or pipeline stage has a meaning.",
    _HEAD,
    _HEAD + _MESH,
)
MESH_REDECLARED = _code(
    "TVP204", "mesh-redeclared", "the mesh is declared twice",
    "A second `mesh` statement appears (in the file or a `use`d fragment).",
    "Layouts would silently refer to one of two different device meshes.",
    _HEAD + _MESH + "mesh dp=4\n",
    _HEAD + _MESH,
)
INVALID_MESH_SIZE = _code(
    "TVP205", "invalid-mesh-size", "a mesh axis size is not a positive integer",
    "A mesh axis has size 0, a negative size or a fraction, or the mesh would hold more "
    "than 2**63 - 1 devices.",
    "A mesh axis counts devices; it must be a whole number of at least 1.",
    _HEAD + "mesh dp=0, tp=2\n",
    _HEAD + "mesh dp=1, tp=2\n",
)
DUPLICATE_MESH_AXIS = _code(
    "TVP206", "duplicate-mesh-axis", "a mesh axis name is used twice",
    "The `mesh` statement names the same axis twice, or names an axis `batch`, `seq` or "
    "`microbatches`, which expressions read as the step's counts.",
    "Axis names address groups of devices and are numbers in expressions; a repeated name is "
    "ambiguous.",
    _HEAD + "mesh dp=2, dp=2\n",
    _HEAD + "mesh dp=2, tp=2\n",
)
UNKNOWN_MESH_AXIS = _code(
    "TVP207", "unknown-mesh-axis", "a statement names a mesh axis the mesh does not have",
    "A layout, collective, optimizer shard or algorithm refers to an axis not in `mesh`.",
    "The statement would address a device group that does not exist.",
    _HEAD + _MESH + "split tokens [dq, -]\n",
    _HEAD + _MESH + "split tokens [dp, -]\n",
)
MISPLACED_STATEMENT = _code(
    "TVP208", "misplaced-statement", "a statement stands where it is not allowed",
    "`use`, `template` or `plan` appears inside a `for` loop or a template body.",
    "Imports, template definitions and the plan name belong to a file, not to a loop or a "
    "template expansion.",
    _HEAD + _MESH + "for l in layers:\n    use \"stdlib/none.tvp\"\n",
    _HEAD + _MESH,
)

# ---------------------------------------------------------------- imports

USE_NOT_FOUND = _code(
    "TVP210", "use-not-found", "a `use`d file does not exist",
    "Neither the including file's folder nor the project root holds the `use`d path.",
    "The plan would silently lack the templates and statements of that file.",
    _HEAD + _MESH + 'use "no/such/fragment.tvp"\n',
    _HEAD + _MESH,
)
USE_CYCLE = _code(
    "TVP211", "use-cycle", "files `use` each other in a cycle",
    "Following `use` statements leads back to a file already being included. The example "
    "needs `cycle_a.tvp` holding `use \"cycle_b.tvp\"` and `cycle_b.tvp` holding "
    "`use \"cycle_a.tvp\"`.",
    "Inclusion would never end; the order of the statements would be undefined.",
    _HEAD + _MESH + 'use "cycle_a.tvp"\n',
    _HEAD + _MESH,
)
USE_OUTSIDE_ROOT = _code(
    "TVP212", "use-outside-root", "a `use`d path leaves the project",
    "The `use`d path (after `..` and symlinks) lies outside the project root and the main "
    "plan's folder.",
    "Plans must be reproducible from the repository; they may not read arbitrary files.",
    _HEAD + _MESH + 'use "../../../../../../etc/hosts"\n',
    _HEAD + _MESH,
)

# ---------------------------------------------------------------- templates and expressions

UNKNOWN_TEMPLATE = _code(
    "TVP215", "unknown-template", "`apply` names a template that is not defined",
    "No template of that name is defined in the file or in a file `use`d before.",
    "The layouts and collectives the template would add are missing.",
    _HEAD + _MESH + "template col(m, axis=tp):\n    split m.weight [axis, -]\n"
    "apply colum(layers.0.wq)\n",
    _HEAD + _MESH + "template col(m, axis=tp):\n    split m.weight [axis, -]\n"
    "apply col(layers.0.wq)\n",
)
TEMPLATE_ARGUMENTS = _code(
    "TVP216", "template-arguments", "`apply` passes the wrong arguments",
    "Too many or too few arguments, an unknown keyword, or a parameter given twice.",
    "A parameter would be unbound or silently ignored.",
    _HEAD + _MESH + "template col(m, axis=tp):\n    split m.weight [axis, -]\n"
    "apply col(layers.0.wq, tp, dp)\n",
    _HEAD + _MESH + "template col(m, axis=tp):\n    split m.weight [axis, -]\n"
    "apply col(layers.0.wq, tp)\n",
)
TEMPLATE_RECURSION = _code(
    "TVP217", "template-recursion", "a template applies itself (directly or not)",
    "Expanding the template reaches an `apply` of a template already being expanded.",
    "Templates have no conditionals, so the expansion would never end.",
    _HEAD + _MESH + "template t(m):\n    apply t(m)\napply t(layers.0)\n",
    _HEAD + _MESH + "template t(m):\n    split m.weight [tp, -]\napply t(layers.0)\n",
)
DUPLICATE_TEMPLATE = _code(
    "TVP218", "duplicate-template", "a template is defined twice",
    "Two `template` definitions share one name.",
    "Which one an `apply` expands would depend on file order.",
    _HEAD + _MESH + "template t(m):\n    split m.weight [tp, -]\n"
    "template t(m):\n    split m.weight [-, tp]\n",
    _HEAD + _MESH + "template t(m):\n    split m.weight [tp, -]\n",
)
TEMPLATE_ARGUMENT_KIND = _code(
    "TVP219", "template-argument-kind", "a template argument has the wrong kind",
    "A parameter is used as a mesh axis but bound to a number or a dotted path, or used as a "
    "path but bound to a number, or used as a value but bound to a dotted path.",
    "The substituted statement would not mean what the template says.",
    _HEAD + _MESH + "template col(m, axis):\n    split m.weight [axis, -]\n"
    "apply col(layers.0, 2)\n",
    _HEAD + _MESH + "template col(m, axis):\n    split m.weight [axis, -]\n"
    "apply col(layers.0, tp)\n",
)
EXPANSION_LIMIT = _code(
    "TVP220", "expansion-limit", "template and loop expansion grows too large",
    "Expanding templates and loops produced more statements than the resolver allows "
    "(100,000 steps) or nested deeper than 200 levels.",
    "Such a plan is almost certainly a mistake and would make every tool slow.",
    _HEAD + _MESH
    + "".join(f"template t{i}(m):\n" + f"    apply t{i + 1}(m)\n" * 8 for i in range(8))
    + "template t8(m):\n    split m.weight [tp, -]\napply t0(layers.0)\n",
    _HEAD + _MESH + "template t0(m):\n    split m.weight [tp, -]\napply t0(layers.0)\n",
)
UNKNOWN_NAME = _code(
    "TVP225", "unknown-name", "an expression uses a name that has no value",
    "Names in expressions are `microbatches`, `batch`, `seq`, mesh axes and template "
    "parameters; this one is none of them.",
    "The value cannot be computed.",
    _HEAD + _MESH + "microbatches 4\nloss-scale 1/microbatch\n",
    _HEAD + _MESH + "microbatches 4\nloss-scale 1/microbatches\n",
)
DIVISION_BY_ZERO = _code(
    "TVP226", "division-by-zero", "an expression divides by zero",
    "An exact expression evaluates a division whose divisor is 0.",
    "The value is undefined.",
    _HEAD + _MESH + "loss-scale 1/(dp - 2)\n",
    _HEAD + _MESH + "loss-scale 1/dp\n",
)
INVALID_NUMBER = _code(
    "TVP227", "invalid-number", "a number has the wrong kind",
    "A place that needs a whole number (a dimension, a stage index, a batch size) received a "
    "fraction or a negative value, or a slice has step 0.",
    "Dimensions, indices and counts are whole numbers.",
    _HEAD + _MESH + "all-gather layers.0.out over tp dim=1/2\n",
    _HEAD + _MESH + "all-gather layers.0.out over tp dim=1\n",
)

# ---------------------------------------------------------------- layouts

AXIS_USED_TWICE = _code(
    "TVP230", "axis-used-twice", "one mesh axis appears twice in one layout or group",
    "A `split` or `place` gives one mesh axis two placements (two dimensions, or twice in one), "
    "or an `over` group (of a collective, `partial`, `algorithm` or `shard over`) names one "
    "axis twice.",
    "Each rank holds one block along each axis; an axis can split only one dimension once.",
    _HEAD + _MESH + "split layers.0.wq.weight [tp, tp]\n",
    _HEAD + _MESH + "split layers.0.wq.weight [tp, -]\n",
)
SPLIT_AND_PARTIAL = _code(
    "TVP231", "split-and-partial", "a tensor is both split and partial over one axis",
    "Statements about one tensor split it over an axis and also declare it partial there.",
    "A piece is either a block of the value or a summand of it, not both.",
    _HEAD + _MESH + "split layers.0.wo.out [tp, -]\npartial layers.0.wo.out over tp\n",
    _HEAD + _MESH + "partial layers.0.wo.out over tp\n",
)
CONFLICTING_LAYOUT = _code(
    "TVP232", "conflicting-layout", "two statements give one tensor different layouts",
    "Two layout statements for the same target give one axis different placements.",
    "Only one can describe where the pieces live; the other is a stale or wrong claim.",
    _HEAD + _MESH + "split layers.0.wq.weight [tp, -]\nsplit layers.0.wq.weight [-, tp]\n",
    _HEAD + _MESH + "split layers.0.wq.weight [tp, -]\n",
)
DUPLICATE_STATEMENT = _code(
    "TVP233", "duplicate-statement", "the same statement appears twice",
    "A layout or collective statement repeats an earlier identical one.",
    "A repeated layout is harmless but a repeated collective runs twice (a doubled "
    "all-reduce); either way it is usually a copy-paste slip.",
    _HEAD + _MESH + "split tokens [dp, -]\nsplit tokens [dp, -]\n",
    _HEAD + _MESH + "split tokens [dp, -]\n",
    Severity.WARNING,
)
SPLIT_NOT_DIVISIBLE = _code(
    "TVP234", "split-not-divisible", "a split dimension does not divide evenly",
    "A tensor dimension of known size is split over mesh axes (and, for the batch, "
    "microbatches) whose product does not divide it.",
    "Block distribution needs equal blocks; uneven pieces change the computation.",
    _HEAD + "mesh dp=3, tp=2\nsplit tokens [dp, -]\n",
    _HEAD + "mesh dp=2, tp=2\nsplit tokens [dp, -]\n",
)
LAYOUT_RANK_MISMATCH = _code(
    "TVP235", "layout-rank-mismatch", "a layout has the wrong number of entries",
    "A positional `place` lists a different number of placements than the mesh has axes, or "
    "a layout of `tokens`/`labels` names a dimension they do not have.",
    "Entries would be matched to the wrong axes or dimensions.",
    _HEAD + _MESH + "split tokens [dp, -, -]\n",
    _HEAD + _MESH + "split tokens [dp, -]\n",
)
BLOCK_ORDER = _code(
    "TVP237", "block-order", "a split states a block order that is unknown or cannot apply",
    "A split entry names an order other than `contiguous` or `zigzag` (`zigzg(cp)`), puts "
    "`zigzag` on the batch dimension of a model input, or on a parameter. Zigzag is the "
    "load-balanced order of context parallelism: a sequence of `n` positions split over `N` "
    "ranks is cut into `2N` chunks, and block `k` holds chunks `k` and `2N-1-k` "
    "(docs/semantics.md §2.6).",
    "The order decides which positions each rank holds; an unknown one has no meaning, and "
    "the batch (cut by microbatches first, Rule 4.1) and the parameters have no positions to "
    "balance.",
    _HEAD + "mesh dp=2, cp=2\nsplit tokens [dp, zigzg(cp)]\n",
    _HEAD + "mesh dp=2, cp=2\nsplit tokens [dp, zigzag(cp)]\n",
)

PIPELINE_AXIS_LAYOUT = _code(
    "TVP236", "pipeline-axis-layout", "a layout splits a tensor over `pp` or makes it partial "
    "over `pp`",
    "A `split`, `partial` or `place` gives the pipeline axis `pp` a `Shard` or `Partial` "
    "placement (on an input, a parameter, an activation, a gradient or the loss).",
    "`pp` places modules on stages, it does not cut tensors (docs/semantics.md §5): a tensor "
    "of a stage exists only on that stage's ranks, so no piece of it lives on the others. "
    "Megatron and torchtitan never shard a tensor over the pipeline dimension; the statement "
    "would otherwise be ignored.",
    _HEAD + "mesh pp=2, dp=2\nsplit layers.0.attention.wq.weight [pp, -]\n",
    _HEAD + "mesh pp=2, dp=2\nsplit tokens [dp, -]\n",
)

# ---------------------------------------------------------------- pipeline

PIPELINE_WITHOUT_PP = _code(
    "TVP240", "pipeline-without-pp", "pipeline stages without a `pp` mesh axis",
    "`pipeline-stage` or `send` is used but the mesh has no `pp` axis.",
    "Stages are pp ranks; without the axis they have nowhere to run.",
    _HEAD + _MESH + "pipeline-stage 0: embed, layers\n",
    _HEAD + "mesh pp=1, dp=2, tp=2\npipeline-stage 0: embed, layers\n",
)
STAGE_OUT_OF_RANGE = _code(
    "TVP241", "stage-out-of-range", "a stage index is not a pp rank",
    "A `pipeline-stage` or `send` names a stage outside 0 .. pp-1.",
    "The work or transfer would go to a pp rank that does not exist.",
    _HEAD + "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[0:2]\n"
    "pipeline-stage 1: layers[2:4]\npipeline-stage 2: norm\n",
    _HEAD + "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[0:2]\n"
    "pipeline-stage 1: layers[2:4], norm\n",
)
STAGE_OVERLAP = _code(
    "TVP242", "stage-overlap", "two pipeline stages claim the same module",
    "A module or layer is assigned to two stages (or a stage number is declared twice).",
    "A module runs on exactly one pp rank; two owners mean two different copies.",
    _HEAD + "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[0:3]\n"
    "pipeline-stage 1: layers[2:4]\n",
    _HEAD + "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[0:2]\n"
    "pipeline-stage 1: layers[2:4]\n",
)
STAGE_GAP = _code(
    "TVP243", "stage-gap", "pipeline stage numbers have gaps",
    "Some pp rank in 0 .. pp-1 has no `pipeline-stage` while others do.",
    "That rank would idle and the send/recv chain between stages would break.",
    _HEAD + "mesh pp=3, dp=2\npipeline-stage 0: embed, layers[0:2]\n"
    "pipeline-stage 2: layers[2:4]\n",
    _HEAD + "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[0:2]\n"
    "pipeline-stage 1: layers[2:4]\n",
)
STAGE_ORDER = _code(
    "TVP244", "stage-order", "pipeline stages do not follow the layer order",
    "A stage holds a layer that comes before a layer of an earlier stage.",
    "Activations flow from stage k to k+1; out-of-order layers break the data dependencies.",
    _HEAD + "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[2:4]\n"
    "pipeline-stage 1: layers[0:2]\n",
    _HEAD + "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[0:2]\n"
    "pipeline-stage 1: layers[2:4]\n",
)
STAGE_COVERAGE = _code(
    "TVP245", "stage-coverage", "pipeline stages do not cover every layer",
    "Some layers (elements of a module list the stages select from, such as `layers[0:8]` "
    "or `blocks[2:4]`, whatever the list is called) are in no stage. `tvp lint` knows a "
    "list's length from a layer count (stdlib configs, `n_layers` on the spec line); `tvp "
    "lint --spec`, `tvp simulate` and `tvp check` read it from the model.",
    "Unassigned layers never run; the plan computes a different model.",
    'plan demo\nspec "stdlib/models/llama.py:Llama" config llama3_8b batch 8 seq 16\n'
    "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[0:8]\npipeline-stage 1: layers[8:16]\n",
    'plan demo\nspec "stdlib/models/llama.py:Llama" config llama3_8b batch 8 seq 16\n'
    "mesh pp=2, dp=2\npipeline-stage 0: embed, layers[0:16]\npipeline-stage 1: layers[16:]\n",
)

PIPELINE_AXIS_GROUP = _code(
    "TVP246", "pipeline-axis-group", "a collective, gradient statement, algorithm or ZeRO "
    "shard groups ranks over `pp`",
    "A collective (`over pp`, on an activation or on `grad(...)`), an `algorithm ... over pp` "
    "or `optimizer ... shard over pp` forms groups along the pipeline axis.",
    "A group over `pp` holds one rank per stage, but a tensor, a parameter and its gradient "
    "exist on one stage only (docs/semantics.md §5): the other members have nothing to "
    "contribute. Values move between stages by the implied transfers or `send`; gradients "
    "and ZeRO shards go over the data axes (DeepSpeed and Megatron shard optimizer states "
    "over the data-parallel group). The one exception is the embedding group of a tied "
    "parameter, `all-reduce grad(embed.weight) over pp` (pp alone): it sums the copies that "
    "the stages using the parameter hold (docs/semantics.md §5.4), and the lowering reports "
    "it here when a parameter it names is used on one stage only.",
    _HEAD + "mesh pp=2, dp=2\nall-reduce grad(params) over dp, pp op=avg\n",
    _HEAD + "mesh pp=2, dp=2\nall-reduce grad(params) over dp op=avg\n",
)
VIRTUAL_STAGES = _code(
    "TVP247", "virtual-stages", "an interleaved pipeline without well-formed virtual stages",
    "With `schedule interleaved-1f1b` every pp rank holds the same number v >= 2 of layer "
    "chunks (Megatron's virtual pipeline stages): a `pipeline-stage` lists its chunks as "
    "layer ranges, chunk c of pp rank r is virtual stage c*pp + r, and the chunks follow the "
    "layer order round-robin over the pp ranks. The microbatches must be divisible by pp, and "
    "transfers are implied (no explicit `send`).",
    "An interleaved schedule over one chunk per rank is a plain 1F1B pipeline under another "
    "name, usually a forgotten virtual-pipeline setting; chunks out of round-robin order, or "
    "unequal chunk counts, do not describe Megatron's interleaved schedule, which also "
    "requires microbatches divisible by pp.",
    _HEAD + "mesh pp=2, dp=2\nmicrobatches 4 schedule interleaved-1f1b\n"
    "pipeline-stage 0: embed, layers[0:2]\npipeline-stage 1: layers[2:4], norm, output, loss\n",
    _HEAD + "mesh pp=2, dp=2\nmicrobatches 4 schedule interleaved-1f1b\n"
    "pipeline-stage 0: embed, layers[0:1], layers[2:3]\n"
    "pipeline-stage 1: layers[1:2], layers[3:4], norm, output, loss\n",
)

RANK_OVERRIDE = _code(
    "TVP249", "rank-override", "a per-rank override that cannot hold",
    "`on AXIS=K, ...: optimizer ...` replaces the plan-wide optimizer on the ranks with those "
    "coordinates (docs/semantics.md §6.4). Each coordinate must name a mesh axis and lie in "
    "0 .. size-1; the plan must have an `optimizer` of the same kind (the override changes "
    "hyper-parameters, not the optimizer states); the ZeRO sharding is the plan-wide one (no "
    "`shard` in an override); and no rank may match two overrides.",
    "An override that matches no rank, or two that disagree on one rank, leaves it unclear "
    "what that rank runs.",
    _HEAD + _MESH + "optimizer adamw lr=1e-3\non dp=2: optimizer adamw lr=1e-3 eps=1e-6\n",
    _HEAD + _MESH + "optimizer adamw lr=1e-3\non dp=1: optimizer adamw lr=1e-3 eps=1e-6\n",
)

# ---------------------------------------------------------------- step settings and optimizer

INVALID_MICROBATCHES = _code(
    "TVP250", "invalid-microbatches", "microbatches is not a positive integer",
    "`microbatches` is 0, negative or a fraction.",
    "A step runs a whole, positive number of microbatches.",
    _HEAD + _MESH + "microbatches 0\n",
    _HEAD + _MESH + "microbatches 2\n",
)
INVALID_LOSS_SCALE = _code(
    "TVP251", "invalid-loss-scale", "the loss scale is not positive",
    "`loss-scale` evaluates to zero or a negative number.",
    "A zero or negative backward seed zeroes or flips every gradient.",
    _HEAD + _MESH + "loss-scale 0\n",
    _HEAD + _MESH + "loss-scale 1/2\n",
)
UNKNOWN_OPTIMIZER = _code(
    "TVP252", "unknown-optimizer", "the optimizer kind is not known",
    "Known optimizers: `sgd`, `adam`, `adamw`.",
    "The checker cannot state the update step of an unknown optimizer.",
    _HEAD + _MESH + "optimizer adamm lr=1e-3\n",
    _HEAD + _MESH + "optimizer adam lr=1e-3\n",
)
UNKNOWN_HYPERPARAMETER = _code(
    "TVP253", "unknown-hyperparameter", "the optimizer does not take this hyper-parameter",
    "sgd takes lr, momentum, weight-decay; adam/adamw take lr, betas, eps, weight-decay.",
    "A misspelt hyper-parameter would silently keep its default.",
    _HEAD + _MESH + "optimizer adamw lr=1e-3 weight_decay=0.1\n",
    _HEAD + _MESH + "optimizer adamw lr=1e-3 weight-decay=0.1\n",
)
MISSING_HYPERPARAMETER = _code(
    "TVP254", "missing-hyperparameter", "the optimizer lacks a required hyper-parameter",
    "Every optimizer needs `lr`.",
    "Without a learning rate the update step is undefined.",
    _HEAD + _MESH + "optimizer sgd momentum=0.9\n",
    _HEAD + _MESH + "optimizer sgd lr=0.1 momentum=0.9\n",
)
INVALID_OPTION_VALUE = _code(
    "TVP255", "invalid-option-value", "an option has a value of the wrong kind",
    "A numeric option received a word or tuple, `betas` is not a pair of numbers in [0, 1), "
    "an optimizer hyper-parameter is negative (torch.optim rejects these too), or a word "
    "option received a number.",
    "The statement cannot be given a meaning.",
    _HEAD + _MESH + "optimizer adam lr=1e-3 betas=0.9\n",
    _HEAD + _MESH + "optimizer adam lr=1e-3 betas=(0.9, 0.999)\n",
)

GRADIENT_STATEMENT_KIND = _code(
    "TVP256", "gradient-statement-kind", "a gradient statement is not an all-reduce or a "
    "reduce-scatter, or states a backward",
    "A collective on `grad(...)` other than `all-reduce` and `reduce-scatter` (`all-gather`, "
    "`all-to-all`, `scatter`, `copy`), or a gradient statement with `backward ...`.",
    "Gradient statements run after the backward (docs/semantics.md §4.5): they have no "
    "backward of their own, and gradient synchronisation in DDP, Megatron, DeepSpeed and FSDP "
    "is an all-reduce (or a reduce-scatter, for sharded optimizer states). `copy` is the "
    "identity on a gradient; an all-gather of gradients rebuilds what the optimizer step "
    "already does for parameters under `shard over`; all-to-all and scatter would hand the "
    "optimizer gradients of other slices. None of them is synchronisation, so the statement "
    "would otherwise be dropped.",
    _HEAD + _MESH + "copy grad(params) over dp\n",
    _HEAD + _MESH + "all-reduce grad(params) over dp op=avg\n",
)

# ---------------------------------------------------------------- options and names

UNKNOWN_OPTION = _code(
    "TVP260", "unknown-option", "a statement does not take this option",
    "A collective, `partial` or `clip-grad-norm` received an option it does not know.",
    "A misspelt option is silently ignored otherwise.",
    _HEAD + _MESH + "all-gather layers.0.out over tp dims=1\n",
    _HEAD + _MESH + "all-gather layers.0.out over tp dim=1\n",
)
MISSING_OPTION = _code(
    "TVP261", "missing-option", "a collective lacks a required option",
    "all-gather, reduce-scatter and scatter need `dim=`; all-to-all needs `split-dim=` and "
    "`concat-dim=`.",
    "Without it the collective's forward meaning is undefined.",
    _HEAD + _MESH + "all-gather layers.0.out over tp\n",
    _HEAD + _MESH + "all-gather layers.0.out over tp dim=1\n",
)
INVALID_BACKWARD = _code(
    "TVP262", "invalid-backward", "a collective states an unknown backward",
    "Valid backward kinds: identity, all-reduce, all-gather, reduce-scatter, all-to-all, "
    "scatter.",
    "The backward meaning of the collective would be undefined.",
    _HEAD + _MESH + "all-reduce layers.0.out over tp backward all-reduc\n",
    _HEAD + _MESH + "all-reduce layers.0.out over tp backward all-reduce\n",
)
UNKNOWN_REDUCE_OP = _code(
    "TVP263", "unknown-reduce-op", "a reduce op is not known",
    "`op=` takes sum, avg, max or min (reduce-scatter: sum or avg).",
    "The reduction the collective or partial layout performs would be undefined.",
    _HEAD + _MESH + "all-reduce grad(params) over dp op=mean\n",
    _HEAD + _MESH + "all-reduce grad(params) over dp op=avg\n",
)
UNKNOWN_ALGORITHM = _code(
    "TVP264", "unknown-algorithm", "the parallel algorithm is not known",
    "Known algorithms: vocab-parallel-embedding, vocab-parallel-cross-entropy, "
    "context-parallel-attention, expert-parallel.",
    "Nothing would implement (or check) the algorithm the plan asks for.",
    _HEAD + _MESH + "algorithm vocab-parallel-crossentropy for output, loss over tp\n",
    _HEAD + _MESH + "algorithm vocab-parallel-cross-entropy for output, loss over tp\n",
)
UNKNOWN_SCHEDULE = _code(
    "TVP265", "unknown-schedule", "the pipeline schedule is not known",
    "Known schedules: gpipe, 1f1b, interleaved-1f1b.",
    "The schedule orders the work; an unknown one cannot be simulated.",
    _HEAD + _MESH + "microbatches 4 schedule 1f2b\n",
    _HEAD + _MESH + "microbatches 4 schedule 1f1b\n",
)
UNKNOWN_MODEL_CONFIG = _code(
    "TVP266", "unknown-model-config", "the stdlib model has no config of this name",
    "The spec names a stdlib model and a config not found in stdlib/models/configs.json.",
    "The model cannot be built, and layer coverage cannot be checked.",
    'plan demo\nspec "stdlib/models/llama.py:Llama" config llama3_8bb batch 8 seq 16\n' + _MESH,
    'plan demo\nspec "stdlib/models/llama.py:Llama" config llama3_8b batch 8 seq 16\n' + _MESH,
    Severity.WARNING,
)
DUPLICATE_OPTION = _code(
    "TVP267", "duplicate-option", "a statement gives one option twice",
    "The same `key=` appears twice in one statement (a collective, `partial`, `optimizer`, "
    "`clip-grad-norm`, `algorithm` or the settings of `spec`).",
    "Which of the two values counts would be a guess.",
    _HEAD + _MESH + "all-reduce grad(params) over dp op=sum op=avg\n",
    _HEAD + _MESH + "all-reduce grad(params) over dp op=avg\n",
)
LAYER_OUT_OF_RANGE = _code(
    "TVP268", "layer-out-of-range", "a statement names layers the model does not have",
    "With a known layer count (a stdlib config, or `n_layers` on the spec line) and one "
    "module list the plan indexes (whatever its name), a target such as "
    "`layers.40.attention.wq.weight`, or a slice `layers[24:40]`, reaches past the last "
    "layer.",
    "The statement silently applies to fewer layers than written (or to none): usually the "
    "plan was written for another model size.",
    'plan demo\nspec "stdlib/models/llama.py:Llama" config llama_tiny batch 8 seq 16\n' + _MESH
    + "split layers.2.attention.wq.weight [tp, -]\n",
    'plan demo\nspec "stdlib/models/llama.py:Llama" config llama_tiny batch 8 seq 16\n' + _MESH
    + "split layers.1.attention.wq.weight [tp, -]\n",
)

PARAM_GROUP = _code(
    "TVP269", "param-group", "a parameter group that cannot hold",
    "`on TARGET, ...: optimizer ...` (or `spec-optimizer ...`) updates the parameters the targets "
    "select with other hyper-parameters, as a torch.optim parameter group (docs/semantics.md "
    "§6.5). The plan must have the plan-wide statement it refines (`optimizer`, or "
    "`spec-optimizer` for a reference group), of the same kind; the ZeRO sharding is the "
    "plan-wide one (no `shard`) and clipping the recipe's (no `clip-grad-norm=`); an `on` names "
    "mesh coordinates or parameters, not both; every target must select a parameter, and no "
    "parameter may be in two groups of one side.",
    "A parameter in two groups, or a group with another optimizer, leaves it unclear which "
    "update the parameter gets (torch refuses both).",
    _HEAD + _MESH + "optimizer adamw lr=1e-3\non norm.weight: optimizer sgd lr=1e-3\n",
    _HEAD + _MESH + "optimizer adamw lr=1e-3\non norm.weight: optimizer adamw weight-decay=0\n",
)

OPTIMIZER_DIFFERS = _code(
    "TVP280", "optimizer-differs-from-spec", "the plan's optimizer is not the spec's recipe",
    "The plan's `optimizer` statement names another optimizer, or another value of a "
    "hyper-parameter (defaults filled in as torch.optim's), than the reference step's "
    "`spec-optimizer`.",
    "The parallel step would update the parameters differently from the single-device step "
    "(a learning rate typed on one side only, AdamW's default weight decay forgotten).",
    _HEAD + _MESH + "spec-optimizer adamw lr=3e-4\noptimizer adamw lr=3e-5\n",
    _HEAD + _MESH + "spec-optimizer adamw lr=3e-4\noptimizer adamw lr=3e-4\n",
)
CODES: tuple[Code, ...] = (
    MISSING_PLAN_HEADER, PLAN_HEADER_IN_FRAGMENT, REPEATED_HEADER, MISSING_MESH,
    MESH_REDECLARED, INVALID_MESH_SIZE, DUPLICATE_MESH_AXIS, UNKNOWN_MESH_AXIS,
    MISPLACED_STATEMENT, USE_NOT_FOUND, USE_CYCLE, USE_OUTSIDE_ROOT, UNKNOWN_TEMPLATE,
    TEMPLATE_ARGUMENTS, TEMPLATE_RECURSION, DUPLICATE_TEMPLATE, TEMPLATE_ARGUMENT_KIND,
    EXPANSION_LIMIT, UNKNOWN_NAME, DIVISION_BY_ZERO, INVALID_NUMBER, AXIS_USED_TWICE,
    SPLIT_AND_PARTIAL, CONFLICTING_LAYOUT, DUPLICATE_STATEMENT, SPLIT_NOT_DIVISIBLE,
    LAYOUT_RANK_MISMATCH, BLOCK_ORDER, PIPELINE_AXIS_LAYOUT, PIPELINE_WITHOUT_PP,
    STAGE_OUT_OF_RANGE, STAGE_OVERLAP, STAGE_GAP, STAGE_ORDER, STAGE_COVERAGE, PIPELINE_AXIS_GROUP,
    VIRTUAL_STAGES, RANK_OVERRIDE,
    INVALID_MICROBATCHES, INVALID_LOSS_SCALE, UNKNOWN_OPTIMIZER, UNKNOWN_HYPERPARAMETER,
    MISSING_HYPERPARAMETER, INVALID_OPTION_VALUE, GRADIENT_STATEMENT_KIND, UNKNOWN_OPTION,
    MISSING_OPTION, INVALID_BACKWARD, UNKNOWN_REDUCE_OP, UNKNOWN_ALGORITHM, UNKNOWN_SCHEDULE,
    UNKNOWN_MODEL_CONFIG, DUPLICATE_OPTION, LAYER_OUT_OF_RANGE, PARAM_GROUP, OPTIMIZER_DIFFERS,
)
