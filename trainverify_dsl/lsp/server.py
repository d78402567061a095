"""``tvp lsp``: the language server, pygls over stdio. The only module that starts pygls.

Documents are synchronised in full (the editor sends the whole text on every change: plans
are small, and pygls' incremental updates split lines where the protocol does not). Each
open document's text has one ``Analysis``; diagnostics are published when it is opened,
changed (once the editor has been quiet for ``CHANGE_DELAY``, so a burst of keystrokes in a
long plan is linted once, not once per key) and closed (an empty list, which clears them),
and for every open document when any document is saved (a saved fragment changes what the
plans using it resolve to). Requests are answered for open documents only: the server never
reads a document from disk on request (the files a plan ``use``s it reads as ``tvp lint``
does).

A handler never takes the server down: an exception becomes a ``window/logMessage`` of type
Error (with the traceback, also written to stderr) and an empty result (no hover, no edits,
no location). A crash while linting a document is never shown as a clean file, as in ``tvp
lint``: the document gets one error diagnostic saying so.

Exit status (the protocol's): 0 after ``shutdown`` then ``exit``, 1 when the editor went away
or sent ``exit`` without ``shutdown``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import traceback
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

import trainverify_dsl
from trainverify_dsl.lsp import features
from trainverify_dsl.lsp.analysis import Analysis
from trainverify_dsl.lsp.positions import UTF16, DocumentLines, Position

logger = logging.getLogger(__name__)
NAME = "tvp"
#: Seconds without a further change before a changed document is linted again.
CHANGE_DELAY = 0.2
Handler = TypeVar("Handler", bound=Callable[..., Any])


class TvpLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(NAME, trainverify_dsl.__version__,
                         text_document_sync_kind=types.TextDocumentSyncKind.Full)
        #: the open documents (by the URI the editor gave): the analysis of their text
        self.analyses: dict[str, Analysis] = {}
        #: documents changed and not yet linted again: the timer that will
        self.pending: dict[str, asyncio.TimerHandle] = {}
        self.shutdown_requested = False

    # ------------------------------------------------------------ documents

    def update(self, uri: str) -> None:
        """A new analysis of the open document's current text (pygls keeps the text)."""
        text = self.workspace.get_text_document(uri).source
        self.analyses[uri] = Analysis(uri, to_fs_path(uri) or uri, text)

    def analysis(self, uri: str) -> Analysis | None:
        """The open document's analysis; ``None`` for a document the editor has not opened
        (requests are answered for open documents only: nothing is read on request)."""
        return self.analyses.get(uri)

    def lines(self, analysis: Analysis) -> DocumentLines:
        return DocumentLines.of(analysis.text, self.encoding)

    @property
    def encoding(self) -> str:
        encoding = self.workspace.position_encoding or UTF16
        return str(getattr(encoding, "value", encoding))

    @property
    def markdown(self) -> bool:
        document = self.client_capabilities.text_document
        formats = document.hover.content_format if document and document.hover else None
        return types.MarkupKind.Markdown in (formats or ())

    def publish_soon(self, uri: str) -> None:
        """``publish`` after ``CHANGE_DELAY`` unless the document changes again first."""
        self.cancel_pending(uri)
        self.pending[uri] = asyncio.get_running_loop().call_later(
            CHANGE_DELAY, self._publish_pending, uri)

    def cancel_pending(self, uri: str) -> None:
        timer = self.pending.pop(uri, None)
        if timer is not None:
            timer.cancel()

    def _publish_pending(self, uri: str) -> None:
        self.pending.pop(uri, None)
        try:
            self.publish(uri)
        except Exception as error:
            self.log_internal_error("updating a document", error)

    def publish(self, uri: str) -> None:
        self.cancel_pending(uri)
        analysis = self.analysis(uri)
        if analysis is None:
            return
        try:
            found = features.diagnostics(analysis, self.lines(analysis))
        except Exception as error:  # a linter bug: say so, never show a clean file
            self.log_internal_error(f"linting {analysis.path}", error)
            found = [crash_diagnostic(error)]
        self.publish_list(uri, found)

    def publish_list(self, uri: str, found: list[types.Diagnostic]) -> None:
        version = self.workspace.get_text_document(uri).version if uri in self.analyses else None
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=found, version=version))

    # ------------------------------------------------------------ errors

    def log_internal_error(self, what: str, error: BaseException) -> None:
        summary = f"internal error while {what}: {type(error).__name__}: {error}"
        detail = "".join(traceback.format_exception(error)).rstrip()
        logger.error("%s\n%s", summary, detail)
        try:
            self.window_log_message(types.LogMessageParams(
                type=types.MessageType.Error, message=f"tvp lsp: {summary}\n{detail}"))
        except Exception:  # noqa: BLE001 - the log on stderr above is all that is left
            logger.exception("tvp lsp: cannot send the log message")

    def guarded(self, what: str, empty: Callable[[], Any]) -> Callable[[Handler], Handler]:
        """Run a handler; an exception is logged and answered with ``empty()``."""

        def wrap(handler: Handler) -> Handler:
            @functools.wraps(handler)
            def run(params: Any) -> Any:
                try:
                    return handler(params)
                except Exception as error:
                    self.log_internal_error(what, error)
                    return empty()

            return run  # type: ignore[return-value]

        return wrap


def crash_diagnostic(error: BaseException) -> types.Diagnostic:
    start = types.Position(line=0, character=0)
    return types.Diagnostic(
        range=types.Range(start=start, end=start), severity=types.DiagnosticSeverity.Error,
        source=features.SOURCE,
        message=f"internal error while linting this file: {type(error).__name__}: {error} "
                "(the editor's log has the details; please report it)")


def _position(position: types.Position) -> Position:
    return Position(position.line, position.character)


def build_server() -> TvpLanguageServer:
    """The server with every feature registered (``register_features``)."""
    server = TvpLanguageServer()
    register_features(server)
    return server


def register_features(server: TvpLanguageServer) -> None:
    """Every handler, each behind ``server.guarded``; a long function because it is the
    list of what the server answers."""

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    @server.guarded("opening a document", lambda: None)
    def did_open(params: types.DidOpenTextDocumentParams) -> None:
        server.update(params.text_document.uri)
        server.publish(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    @server.guarded("updating a document", lambda: None)
    def did_change(params: types.DidChangeTextDocumentParams) -> None:
        server.update(params.text_document.uri)
        server.publish_soon(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    @server.guarded("re-linting after a save", lambda: None)
    def did_save(params: types.DidSaveTextDocumentParams) -> None:
        for uri in list(server.analyses):  # a saved fragment changes what the others use
            server.update(uri)
            server.publish(uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    @server.guarded("closing a document", lambda: None)
    def did_close(params: types.DidCloseTextDocumentParams) -> None:
        server.cancel_pending(params.text_document.uri)
        server.analyses.pop(params.text_document.uri, None)
        server.publish_list(params.text_document.uri, [])

    @server.feature(types.TEXT_DOCUMENT_FORMATTING)
    @server.guarded("formatting", list)
    def formatting(params: types.DocumentFormattingParams) -> list[types.TextEdit]:
        analysis = server.analysis(params.text_document.uri)
        if analysis is None:
            return []
        return features.formatting_edits(analysis, server.lines(analysis))

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    @server.guarded("answering a hover", lambda: None)
    def hover(params: types.HoverParams) -> types.Hover | None:
        analysis = server.analysis(params.text_document.uri)
        if analysis is None:
            return None
        return features.hover(analysis, server.lines(analysis), _position(params.position),
                              markdown=server.markdown)

    @server.feature(types.TEXT_DOCUMENT_DEFINITION)
    @server.guarded("finding a definition", lambda: None)
    def definition(params: types.DefinitionParams) -> types.Location | None:
        analysis = server.analysis(params.text_document.uri)
        if analysis is None:
            return None
        return features.definition(analysis, server.lines(analysis), _position(params.position))

    @server.feature(types.SHUTDOWN)
    def shutdown(params: Any) -> None:
        server.shutdown_requested = True


def serve(stdin: BinaryIO, stdout: BinaryIO) -> int:
    """Answer the editor on ``stdin``/``stdout`` until it says ``exit`` or goes away; the
    protocol's exit status."""
    server = build_server()
    server.start_io(stdin, stdout)
    return 0 if server.shutdown_requested else 1
