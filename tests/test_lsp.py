"""``tvp lsp`` driven over stdio as an editor drives it.

A tiny client (``Client``) starts ``python -m trainverify_dsl lsp``, writes JSON-RPC messages
with ``Content-Length`` framing and reads the server's messages on a thread, so every wait
has a timeout: a hung server fails the test instead of hanging the run (the limits are
generous; nothing here measures speed). Positions are the protocol's: 0-based, UTF-16 code
units. In-process tests of the features themselves are in ``test_lsp_features.py``.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pygls.uris import from_fs_path, to_fs_path

import trainverify_dsl
from trainverify_dsl.parse import format_source
from trainverify_dsl.plan import lint_source
from trainverify_dsl.report.codes import lookup
from trainverify_dsl.report.render.explain import explain

ROOT = Path(__file__).resolve().parent.parent
#: How long one answer may take before the test gives up on the server (not a speed limit).
TIMEOUT = 60.0
Message = dict[str, Any]


class Client:
    """The editor's side: requests with ids, notifications, and a queue of what came back."""

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.messages: queue.Queue[Message | None] = queue.Queue()
        self.seen: list[Message] = []
        self.last_id = 0
        self.stderr = b""
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        """Parse framed messages until end of file (``None``); anything else on stdout, a
        header without ``Content-Length`` or a body that is no JSON, fails the test."""
        stream = self.process.stdout
        assert stream is not None
        while True:
            headers: dict[str, str] = {}
            while True:
                line = stream.readline()
                if not line:
                    self.messages.put(None)
                    return
                if line == b"\r\n":
                    break
                name, _, value = line.decode("ascii").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = stream.read(int(headers["content-length"]))
            self.messages.put(json.loads(body.decode("utf-8")))

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr = self.process.stderr.read()

    def send(self, message: Message) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"method": method, "params": params})

    def request(self, method: str, params: Any = None) -> Any:
        self.last_id += 1
        number = self.last_id
        self.send({"id": number, "method": method, "params": params})
        answer = self.wait(lambda m: m.get("id") == number and "method" not in m)
        assert "error" not in answer, answer
        return answer["result"]

    def wait(self, wanted: Callable[[Message], bool]) -> Message:
        """The next message ``wanted`` accepts (the others are kept in ``seen``)."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            left = deadline - time.monotonic()
            try:
                message = self.messages.get(timeout=max(left, 0.001))
            except queue.Empty:
                pytest.fail(f"no answer from the server in {TIMEOUT} s; stderr: "
                            f"{self.stderr.decode(errors='replace')}")
            if message is None:
                pytest.fail("the server closed stdout; stderr: "
                            f"{self.stderr.decode(errors='replace')}")
            self.seen.append(message)
            if wanted(message):
                return message

    def diagnostics(self, uri: str) -> list[Message]:
        message = self.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                            and m["params"]["uri"] == uri)
        return message["params"]["diagnostics"]

    def logged(self) -> list[Message]:
        """The ``window/logMessage`` parameters received so far."""
        return [m["params"] for m in self.seen if m.get("method") == "window/logMessage"]

    def finish(self) -> int:
        """Wait for the process to end; its exit status."""
        try:
            return self.process.wait(timeout=TIMEOUT)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=TIMEOUT)


@pytest.fixture
def start() -> Iterator[Callable[..., Client]]:
    clients: list[Client] = []

    def start_client(*argv: str) -> Client:
        client = Client(list(argv or (sys.executable, "-m", "trainverify_dsl", "lsp")))
        clients.append(client)
        return client

    yield start_client
    for client in clients:
        client.kill()


def initialize(client: Client, *, markdown: bool = True) -> Message:
    formats = ["markdown", "plaintext"] if markdown else ["plaintext"]
    result = client.request("initialize", {
        "processId": None, "rootUri": from_fs_path(str(ROOT)),
        "capabilities": {"textDocument": {"hover": {"contentFormat": formats}}},
    })
    client.notify("initialized", {})
    return result


def open_document(client: Client, uri: str, text: str) -> None:
    client.notify("textDocument/didOpen", {
        "textDocument": {"uri": uri, "languageId": "tvp", "version": 1, "text": text}})


def at(uri: str, line: int, character: int) -> Message:
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}


def span(start_line: int, start: int, end_line: int, end: int) -> Message:
    return {"start": {"line": start_line, "character": start},
            "end": {"line": end_line, "character": end}}


def apply_edits(text: str, edits: list[Message]) -> str:
    """The text after the edits (positions in UTF-16 code units, all against ``text``)."""
    lines = text.splitlines(keepends=True) or [""]

    def offset(position: Message) -> int:
        before = sum(len(line) for line in lines[:position["line"]])
        line = lines[position["line"]] if position["line"] < len(lines) else ""
        units = line.encode("utf-16-le")[:2 * position["character"]]
        return before + len(units.decode("utf-16-le"))

    for edit in sorted(edits, key=lambda e: (e["range"]["start"]["line"],
                                             e["range"]["start"]["character"]), reverse=True):
        start, end = offset(edit["range"]["start"]), offset(edit["range"]["end"])
        text = text[:start] + edit["newText"] + text[end:]
    return text


# ---------------------------------------------------------------- one editing session

FRAGMENT = textwrap.dedent("""\
    # a fragment beside the plan: found relative to the document, not the server's folder
    template my_split(t, axis=dp):
        split t [axis, -]
""")

ON_DISK = "plan disk\nmesh dp=2\nsplit x [zz, -]\n"

#: The unsaved buffer: a syntax error after non-ASCII text on line 5 ("ünï😋": 4 characters,
#: 5 UTF-16 code units, so `extra` starts at character 16, not at column 16 minus one as an
#: ASCII line would have it), an unknown mesh axis on line 6.
BUFFER = textwrap.dedent("""\
    plan demo  # TVP201 is about fragments
    mesh dp=2, tp=2
    microbatches 2
    use "stdlib/megatron.tvp"
    use "frag.tvp"
    use "ünï😋.tvp" extra
    split tokens [dq, -]
    apply column_parallel(layers.0.attention.wq, tp)
    apply my_split(labels)
""")

#: The buffer fixed (no diagnostics) but not in canonical form.
FIXED = textwrap.dedent("""\
    plan demo  # TVP201 is about fragments
    mesh   dp=2,tp=2
    microbatches 2
    use "stdlib/megatron.tvp"
    use "frag.tvp"
    split tokens [dp,-]   # é😋 before nothing
    apply column_parallel(layers.0.attention.wq, tp)
    apply my_split(labels)
""")


def test_an_editing_session(start, tmp_path: Path) -> None:
    tmp_path = tmp_path / "my plans é"  # the URIs are percent-encoded
    tmp_path.mkdir()
    (tmp_path / "frag.tvp").write_text(FRAGMENT)
    plan = tmp_path / "plan.tvp"
    plan.write_text(ON_DISK)  # the server must lint the buffer, not this
    uri = from_fs_path(str(plan))
    client = start()

    capabilities = initialize(client)["capabilities"]
    assert capabilities["positionEncoding"] == "utf-16"
    assert capabilities["textDocumentSync"]["change"] == 1  # full text on every change
    assert capabilities["hoverProvider"] and capabilities["definitionProvider"]
    assert capabilities["documentFormattingProvider"]

    open_document(client, uri, BUFFER)
    found = client.diagnostics(uri)
    assert [(d["code"], d["severity"], d["source"], d["range"]) for d in found] == [
        ("TVP101", 1, "tvp", span(5, 16, 5, 21)),
        ("TVP207", 1, "tvp", span(6, 14, 6, 16)),
    ]
    assert found[0]["message"] == "unexpected 'extra': expected the end of the line"
    assert found[1]["message"].startswith("unknown mesh axis 'dq'; did you mean 'dp'?\nnote: ")

    hover = client.request("textDocument/hover", at(uri, 6, 15))  # on `dq`: the code
    assert hover["contents"] == {"kind": "markdown",
                                 "value": f"```text\n{explain(lookup('TVP207'))}```"}

    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2},
                                             "contentChanges": [{"text": FIXED}]})
    assert client.diagnostics(uri) == []  # fixed: cleared

    edits = client.request("textDocument/formatting",
                           {"textDocument": {"uri": uri},
                            "options": {"tabSize": 4, "insertSpaces": True}})
    assert edits and apply_edits(FIXED, edits) == format_source(FIXED).text

    hover = client.request("textDocument/hover", at(uri, 0, 15))  # `TVP201` in a comment
    assert hover["contents"]["value"] == f"```text\n{explain(lookup('TVP201'))}```"
    assert hover["range"] == span(0, 13, 0, 19)
    hover = client.request("textDocument/hover", at(uri, 1, 2))  # the keyword `mesh`
    assert hover["contents"]["value"].startswith("**mesh** `mesh AXIS=SIZE, ...`\n\n")
    assert "outermost first" in hover["contents"]["value"]
    assert client.request("textDocument/hover", at(uri, 5, 8)) is None  # `tokens`: a name

    megatron = Path(trainverify_dsl.STDLIB_DIR, "megatron.tvp")
    line = megatron.read_text().splitlines().index("template column_parallel(m, axis=tp):")
    location = client.request("textDocument/definition", at(uri, 6, 10))
    assert Path(to_fs_path(location["uri"])) == megatron.resolve()
    assert location["range"] == span(line, 9, line, 24)
    location = client.request("textDocument/definition", at(uri, 7, 8))  # apply my_split
    assert Path(to_fs_path(location["uri"])) == (tmp_path / "frag.tvp").resolve()
    assert location["range"] == span(1, 9, 1, 17)
    location = client.request("textDocument/definition", at(uri, 4, 6))  # use "frag.tvp"
    assert Path(to_fs_path(location["uri"])) == (tmp_path / "frag.tvp").resolve()
    assert location["range"] == span(0, 0, 0, 0)

    broken = FIXED + "split (\n"
    client.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 3},
                                             "contentChanges": [{"text": broken}]})
    (syntax_error,) = client.diagnostics(uri)
    assert [syntax_error["code"]] == [d.code.id for d in lint_source(broken, plan)]
    assert syntax_error["code"].startswith("TVP1")
    assert client.request("textDocument/formatting", {"textDocument": {"uri": uri},
                                                      "options": {"tabSize": 4,
                                                                  "insertSpaces": True}}) == []

    # a saved fragment: every open plan is linted again against it
    (tmp_path / "frag.tvp").write_text("# emptied\n")
    client.notify("textDocument/didSave",
                  {"textDocument": {"uri": from_fs_path(str(tmp_path / "frag.tvp"))}})
    saved = [d["code"] for d in client.diagnostics(uri)]
    assert saved == [d.code.id for d in lint_source(broken, plan)]
    assert lookup("unknown-template").id in saved  # `apply my_split` lost its template

    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert client.diagnostics(uri) == []
    assert client.request("shutdown") is None
    client.notify("exit")
    assert client.finish() == 0
    assert client.messages.get(timeout=TIMEOUT) is None  # nothing after the last answer
    assert b"Traceback" not in client.stderr
    assert plan.read_text() == ON_DISK  # formatting edits, never writes


def test_positions_in_the_encoding_the_editor_asks_for(start, tmp_path: Path) -> None:
    (tmp_path / "frag.tvp").write_text(FRAGMENT)
    (tmp_path / "plan.tvp").write_text(ON_DISK)
    uri = from_fs_path(str(tmp_path / "plan.tvp"))
    client = start()
    result = client.request("initialize", {
        "processId": None, "rootUri": None,
        "capabilities": {"general": {"positionEncodings": ["utf-8", "utf-16"]}}})
    assert result["capabilities"]["positionEncoding"] == "utf-8"
    client.notify("initialized", {})
    open_document(client, uri, BUFFER)
    first = client.diagnostics(uri)[0]
    # `use "` 5 bytes, `ünï😋` 2 + 1 + 2 + 4, `.tvp" ` 6: `extra` is bytes 20 to 25
    assert (first["code"], first["range"]) == ("TVP101", span(5, 20, 5, 25))
    hover = client.request("textDocument/hover", at(uri, 5, 22))
    assert hover["range"] == span(5, 20, 5, 25)
    assert client.request("shutdown") is None
    client.notify("exit")
    assert client.finish() == 0


# ---------------------------------------------------------------- failures stay contained

CRASHING_SERVER = textwrap.dedent("""\
    import os, sys
    from trainverify_dsl.lsp import features

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    def noisy(*args, **kwargs):
        print("a stray print")
        os.write(1, b"stray bytes on file descriptor 1\\n")
        return None

    features.hover = boom
    features.diagnostics = boom
    features.definition = noisy
    from trainverify_dsl.cli.main import main
    sys.exit(main(["lsp"]))
""")


def test_a_crashing_handler_is_logged_and_answered_empty(start, tmp_path: Path) -> None:
    uri = from_fs_path(str(tmp_path / "plan.tvp"))
    client = start(sys.executable, "-c", CRASHING_SERVER)
    initialize(client)
    open_document(client, uri, "plan demo\nmesh dp=2\n")

    (crash,) = client.diagnostics(uri)  # a linter crash is never a clean file
    assert crash["severity"] == 1 and "internal error while linting" in crash["message"]
    (logged,) = client.logged()  # sent before the diagnostics
    assert logged["type"] == 1 and "RuntimeError: boom" in logged["message"]

    assert client.request("textDocument/hover", at(uri, 0, 1)) is None
    logged = client.logged()[-1]  # sent before the answer
    assert logged["type"] == 1
    assert "internal error while answering a hover: RuntimeError: boom" in logged["message"]
    # stray output goes to stderr: the framing of what follows is intact
    assert client.request("textDocument/definition", at(uri, 0, 1)) is None
    assert client.request("textDocument/formatting",
                          {"textDocument": {"uri": uri}, "options": {"tabSize": 4,
                                                                     "insertSpaces": True}}) == []
    client.notify("exit")  # without shutdown: the protocol's exit status 1
    assert client.finish() == 1
    assert b"a stray print" in client.stderr and b"stray bytes" in client.stderr


def test_the_server_ends_when_the_editor_goes_away(start) -> None:
    client = start()
    initialize(client)
    assert client.process.stdin is not None
    client.process.stdin.close()
    assert client.finish() == 1


# ---------------------------------------------------------------- the command


def test_without_pygls_the_command_says_how_to_install_it() -> None:
    code = ("import sys; sys.modules['pygls'] = None\n"
            "from trainverify_dsl.cli.main import main\nsys.exit(main(['lsp']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "pip install 'trainverify_dsl[lsp]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_lint_and_the_command_table_never_import_pygls(tmp_path: Path) -> None:
    plan = tmp_path / "a.tvp"
    plan.write_text("plan demo\nmesh dp=2\n")
    code = ("import sys\nfrom trainverify_dsl.cli.main import SUBCOMMANDS, build_parser, main\n"
            "[build_parser(name) for name in SUBCOMMANDS]\n"
            "status = main(['lint', sys.argv[1]])\n"
            "print('LOADED=' + ','.join(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('pygls', 'lsprotocol'))))\nsys.exit(status)")
    done = subprocess.run([sys.executable, "-c", code, str(plan)], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^LOADED=$", done.stdout, re.MULTILINE), done.stdout
