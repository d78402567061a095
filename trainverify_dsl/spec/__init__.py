"""The spec side: load a torch model and trace its training step into the IR.

- ``load``: ``load_model(ref, config, **overrides)`` (file.py:Class or a config name).
- ``trace``: ``trace_training_step(model, input_specs, optimizer=None) -> SpecProgram``.
- ``convert``/``fx_import``: Core-ATen FX graphs to IR graphs (one converter per ATen op).
- ``cut``/``compose``: block reuse (trace each distinct block once, call it per layer).
- ``optim``: SGD / Adam / AdamW update steps as IR.
- ``errors``: ``SpecError`` carrying diagnostics (codes TVP3xx).

torch is imported by these modules; import them only where torch is wanted.
"""
