"""Small torch models for the lowering tests (referenced from plans as
``spec "tests/models/tiny_nets.py:Class"``)."""
