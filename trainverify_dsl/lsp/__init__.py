"""The language server behind ``tvp lsp``: ``tvp lint``'s diagnostics as the editor types,
``tvp fmt`` as document formatting, ``tvp explain`` and the keywords' meaning on hover,
go-to-definition for templates and ``use`` paths (docs/editors.md).

    positions.py  spans (1-based, characters) <-> protocol positions (0-based, code units)
    keywords.py   each keyword's form and meaning (the hover text), from docs/language.md
    analysis.py   one document's text -> lint diagnostics, syntax tree, the resolver's walk
    features.py   the features as functions of an analysis (lsprotocol values)
    server.py     pygls over stdio: handlers, publishing, errors logged, never fatal

Needs pygls (the ``lsp`` extra); nothing else in the package imports this one, so ``tvp
lint`` never loads pygls.
"""
