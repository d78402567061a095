"""Diagnostic codes of ``tvp import`` (see report/codes.py for id ranges).

They are about a foreign plan file (a Hugging Face tp plan, a torchtitan parallelize plan, a
Galvatron JSON, an nnScaler AutoDist plan), not about a `.tvp` file: every ``example`` and
``fix`` is a command line comment ``# tvp import FORMAT FILE OPTIONS...`` followed by the text of
``FILE``. tests/test_import_codes.py runs each: the example must be refused with its code, the
fix must import.
"""

from trainverify_dsl.report.diagnostics import Code, Severity

_HF = "# tvp import hf plan.json --config llama_tiny --batch 4 --seq 8 --mesh tp=2\n"
_TT = "# tvp import torchtitan plan.json --config llama_tiny --batch 4 --seq 8 --mesh tp=2\n"
_GALVATRON = "# tvp import galvatron plan.json --config llama_tiny --seq 8 --world-size 4\n"
_GALVATRON_BODY = ('"tp_sizes_enc": "2,2", "tp_consecutive_flags": "1,1", "dp_types_enc": '
                   '"0,0", "global_bsz": 4, "chunks": 1, "default_dp_type": "ddp", "vtp": 2}\n')


def _code(id: str, name: str, summary: str, what: str, why: str, example: str,
          fix: str) -> Code:
    return Code(id, name, Severity.ERROR, summary, what, why, example, fix)


UNREADABLE_IMPORT = _code(
    "TVP601", "unreadable-import", "the foreign plan file cannot be read or parsed",
    "The file is missing, not UTF-8, not valid JSON, or (a Python file) holds something "
    "other than imports and dict literals the importer can read without running it: a "
    "function call outside a parallel style, a comprehension, a name bound elsewhere.",
    "The importer never runs or imports the file's code; what it cannot read as data it "
    "cannot transcribe.",
    _HF + '{"layers.*.self_attn.q_proj": "colwise",}\n',
    _HF + '{"layers.*.self_attn.q_proj": "colwise"}\n',
)
UNKNOWN_STYLE = _code(
    "TVP602", "unknown-style", "a parallel style, class or setting the importer does not know",
    "A Hugging Face style string, a torchtitan/DTensor parallel style class, a placement, or "
    "a Galvatron setting (`pipeline_type`, `default_dp_type`) is not one of the names the "
    "importer has a meaning for. Local aliases such as torchtitan's `colwise_parallel` are "
    "refused too: what they are bound to depends on the code around the plan.",
    "Guessing what an unknown style does would give a plan that checks something else than "
    "what runs.",
    _HF + '{"layers.*.self_attn.q_proj": "colwize"}\n',
    _HF + '{"layers.*.self_attn.q_proj": "colwise"}\n',
)
UNMAPPED_MODULE = _code(
    "TVP603", "unmapped-module", "a module name has no counterpart in the reference model",
    "The foreign plan names a module (a Hugging Face `self_attn.q_proj`, a torchtitan "
    "`tok_embeddings`, an nnScaler op's module) that the importer cannot map onto a module "
    "of the reference model the spec line names (`stdlib/models/*.py`).",
    "A statement about a module the spec does not have would check nothing.",
    _HF + '{"layers.*.self_attn.qkv_proj": "colwise"}\n',
    _HF + '{"layers.*.self_attn.q_proj": "colwise"}\n',
)
INEXPRESSIBLE_PLAN = _code(
    "TVP604", "inexpressible-plan", "the foreign plan cannot be written faithfully as a plan",
    "Part of the foreign plan has no exact transcription: its meaning differs between "
    "releases of the framework (Hugging Face's `sequence_parallel`), it depends on the layer "
    "in a way one mesh cannot give (Galvatron's per-layer tensor-parallel degrees), or it "
    "does something the language has no statement for (all-reducing part of a tensor). The "
    "message says which.",
    "An approximate plan would be proven (or refuted) for a computation that never runs.",
    "# tvp import galvatron plan.json --config llama_tiny --seq 8 --world-size 4\n"
    '{"pp_deg": 1, "tp_sizes_enc": "1,2", "tp_consecutive_flags": "1,1", '
    '"dp_types_enc": "0,0", "global_bsz": 4, "chunks": 1, "default_dp_type": "ddp", '
    '"vtp": 2}\n',
    _GALVATRON + '{"pp_deg": 1, ' + _GALVATRON_BODY,
)
INCONSISTENT_DEGREES = _code(
    "TVP605", "inconsistent-degrees", "degrees or sizes in the foreign plan do not fit",
    "Parallel degrees, layer counts or batch sizes disagree: with each other (a "
    "`pp_division` that does not add up to the layer count), with the reference config "
    "(`num_hidden_layers`), or with an option given on the command line (`--mesh`, "
    "`--batch`, `--world-size`).",
    "Such a plan cannot run as written; any plan made from it would be one of several "
    "guesses.",
    "# tvp import galvatron plan.json --config llama_tiny --seq 8 --world-size 4\n"
    '{"pp_deg": 2, "pp_division": "1,2", "tp_sizes_enc": "2,2", "tp_consecutive_flags": '
    '"1,1", "dp_types_enc": "0,0", "global_bsz": 4, "chunks": 2, "default_dp_type": "ddp", '
    '"vtp": 2, "pipeline_type": "gpipe"}\n',
    "# tvp import galvatron plan.json --config llama_tiny --seq 8 --world-size 4\n"
    '{"pp_deg": 2, "pp_division": "1,1", "tp_sizes_enc": "2,2", "tp_consecutive_flags": '
    '"1,1", "dp_types_enc": "0,0", "global_bsz": 4, "chunks": 2, "default_dp_type": "ddp", '
    '"vtp": 2, "pipeline_type": "gpipe"}\n',
)
MALFORMED_IMPORT = _code(
    "TVP606", "malformed-import", "a required key is missing or has the wrong type",
    "The file parses, but its structure is not the format's: a required key is missing "
    "(Galvatron's `tp_sizes_enc`, nnScaler's `spmd_descs`), a value has the wrong type, a key "
    "appears twice, or a style is given an argument it does not take.",
    "The importer reads the format as its framework does; a file the framework would reject "
    "has no meaning to transcribe.",
    _GALVATRON + '{"pp_deg": "1", ' + _GALVATRON_BODY,
    _GALVATRON + '{"pp_deg": 1, ' + _GALVATRON_BODY,
)
UNSUPPORTED_IMPORT = _code(
    "TVP607", "unsupported-import", "a construct the importer does not transcribe yet",
    "The construct may well be expressible in the plan language, but this importer has no "
    "transcription for it yet (Galvatron's Ulysses sequence parallelism and ZeRO-3, "
    "torchtitan's `PrepareModuleOutput`, DTensor activations across the residual stream). "
    "Write that part of the plan by hand, starting from stdlib/megatron.tvp.",
    "Refusing is honest; a partial plan would silently drop part of the parallelism.",
    _TT + '{"layers.*.attention": "PrepareModuleOutput(output_layouts=Shard(1), '
    'desired_output_layouts=Replicate())"}\n',
    _TT + '{"layers.*.attention.wq": "ColwiseParallel()"}\n',
)

CODES: tuple[Code, ...] = (UNREADABLE_IMPORT, UNKNOWN_STYLE, UNMAPPED_MODULE,
                           INEXPRESSIBLE_PLAN, INCONSISTENT_DEGREES, MALFORMED_IMPORT,
                           UNSUPPORTED_IMPORT)
