"""``tvp lsp``: the language server for editors, on stdin/stdout (docs/editors.md).

Speaks the Language Server Protocol over stdio (JSON-RPC with ``Content-Length`` framing):
diagnostics as in ``tvp lint`` while typing, formatting as ``tvp fmt``, hover with ``tvp
explain`` and the keywords' meaning, go-to-definition for templates and ``use`` paths.
``--stdio`` is accepted and changes nothing (editor clients pass it).

stdout carries the protocol and nothing else: anything else the process writes to it (a
stray ``print``, a library writing to file descriptor 1) goes to stderr, where the server's
own log goes too.

Needs pygls, an optional dependency: without it the command says how to install it and exits
2. Exit codes: 0 after the editor's ``shutdown`` and ``exit``, 1 when the editor went away
without ``shutdown``, 2 when pygls is missing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import BinaryIO

EXIT_USAGE = 2
INSTALL_HINT = ("pip install 'trainverify_dsl[lsp]' (or pip install 'pygls>=2.1,<3' into "
                "the environment tvp runs in)")
#: Distributions the server imports: a missing one means the lsp extra is not installed.
SERVER_DEPENDENCIES = ("pygls", "lsprotocol", "cattrs", "attrs", "attr")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stdio", action="store_true",
                        help="talk over stdin/stdout (the default and only transport)")


def run(args: argparse.Namespace) -> int:
    try:
        from trainverify_dsl.lsp.server import serve
    except ImportError as error:
        print(missing_dependency_message(error), file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="tvp lsp: %(levelname)s: %(message)s")
    return serve(sys.stdin.buffer, protocol_stdout())


def missing_dependency_message(error: ImportError) -> str:
    missing = error.name or ""
    if missing.split(".")[0] in SERVER_DEPENDENCIES:
        return (f"tvp lsp: needs pygls 2 (cannot import {missing!r}); install it with "
                f"{INSTALL_HINT}")
    return (f"tvp lsp: cannot load the language server: {error}; pygls 2 must be installed "
            f"({INSTALL_HINT})")


def protocol_stdout() -> BinaryIO:
    """A binary stream to the real stdout for the protocol; file descriptor 1 and
    ``sys.stdout`` then point to stderr, so nothing else can interleave with the messages."""
    try:
        stdout_fd, stderr_fd = sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not real files (an embedding host)
        return sys.stdout.buffer
    sys.stdout.flush()
    protocol = os.fdopen(os.dup(stdout_fd), "wb")
    os.dup2(stderr_fd, stdout_fd)
    sys.stdout = sys.stderr
    return protocol
