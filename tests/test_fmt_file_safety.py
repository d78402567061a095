"""``tvp fmt`` respects the file it rewrites (issue 13 item 4): read-only files are refused
unless ``--force``, symlinks are written through, the inode (hard links), mode and owner are
kept, and a failed write leaves the original bytes."""

from __future__ import annotations

import argparse
import errno
import os
import stat
from pathlib import Path

import pytest

from trainverify_dsl.cli import fmt_cmd

MESSY = "plan   demo\nmesh   dp=2\n"
TIDY = "plan demo\nmesh dp=2\n"


@pytest.fixture
def fmt(capsys: pytest.CaptureFixture[str]):
    def invoke(*argv: str) -> tuple[int, str, str]:
        parser = argparse.ArgumentParser()
        fmt_cmd.configure(parser)
        status = fmt_cmd.run(parser.parse_args(list(argv)))
        out, err = capsys.readouterr()
        return status, out, err

    return invoke


def plan(path: Path, text: str = MESSY) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_real_formatter_changes_the_sample() -> None:
    from trainverify_dsl.parse import format_source

    assert format_source(MESSY).text == TIDY


def test_a_read_only_file_is_refused_with_a_located_error(fmt, tmp_path: Path) -> None:
    path = plan(tmp_path / "ro.tvp")
    os.chmod(path, 0o444)
    before = path.stat()
    status, out, err = fmt(str(path))
    assert (status, out) == (1, "")
    assert path.read_text(encoding="utf-8") == MESSY
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert f"{path}:1:1: error: the file is read-only; not reformatted (--force rewrites it)" \
        in err.splitlines()
    assert "1 file failed" in err
    assert f"reformatted {path}" not in err.splitlines()


def test_force_rewrites_a_read_only_file_and_keeps_it_read_only(fmt, tmp_path: Path) -> None:
    path = plan(tmp_path / "ro.tvp")
    os.chmod(path, 0o444)
    status, _, err = fmt("--force", str(path))
    assert status == 0, err
    assert path.read_text(encoding="utf-8") == TIDY
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_read_only_matters_only_when_the_file_would_be_written(fmt, tmp_path: Path) -> None:
    canonical = plan(tmp_path / "ok.tvp", TIDY)
    messy = plan(tmp_path / "messy.tvp")
    os.chmod(canonical, 0o444)
    os.chmod(messy, 0o444)
    assert fmt(str(canonical))[0] == 0
    status, _, err = fmt("--check", str(messy))
    assert status == 1
    assert f"would reformat {messy}" in err
    assert "read-only" not in err
    assert messy.read_text(encoding="utf-8") == MESSY


def test_a_symlink_stays_a_symlink_and_its_target_is_formatted(fmt, tmp_path: Path) -> None:
    target = plan(tmp_path / "real" / "target.tvp")
    link = tmp_path / "plans" / "link.tvp"
    link.parent.mkdir()
    link.symlink_to(os.path.join("..", "real", "target.tvp"))
    status, _, err = fmt(str(link))
    assert status == 0, err
    assert link.is_symlink()
    assert os.readlink(link) == os.path.join("..", "real", "target.tvp")
    assert target.read_text(encoding="utf-8") == TIDY
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["target.tvp"]
    assert sorted(p.name for p in link.parent.iterdir()) == ["link.tvp"]


def test_a_symlink_to_a_read_only_file_is_refused(fmt, tmp_path: Path) -> None:
    target = plan(tmp_path / "target.tvp")
    os.chmod(target, 0o444)
    link = tmp_path / "link.tvp"
    link.symlink_to(target)
    assert fmt(str(link))[0] == 1
    assert target.read_text(encoding="utf-8") == MESSY


def test_hard_links_keep_sharing_the_inode(fmt, tmp_path: Path) -> None:
    path = plan(tmp_path / "a.tvp")
    other = tmp_path / "elsewhere" / "b.tvp"
    other.parent.mkdir()
    os.link(path, other)
    inode = path.stat().st_ino
    status, _, err = fmt(str(path))
    assert status == 0, err
    assert path.stat().st_ino == inode == other.stat().st_ino
    assert path.stat().st_nlink == 2
    assert other.read_text(encoding="utf-8") == TIDY


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o664, 0o755])
def test_the_mode_is_kept(fmt, tmp_path: Path, mode: int) -> None:
    path = plan(tmp_path / "a.tvp")
    os.chmod(path, mode)
    assert fmt(str(path))[0] == 0
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert path.read_text(encoding="utf-8") == TIDY


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="changing a file's owner needs root")
def test_owner_and_group_are_kept(fmt, tmp_path: Path) -> None:
    path = plan(tmp_path / "a.tvp")
    os.chown(path, 12345, 23456)
    assert fmt(str(path))[0] == 0
    assert (path.stat().st_uid, path.stat().st_gid) == (12345, 23456)
    assert path.read_text(encoding="utf-8") == TIDY


def test_the_new_text_is_fsynced_before_the_original_is_touched(fmt, tmp_path: Path,
                                                                 monkeypatch) -> None:
    path = plan(tmp_path / "a.tvp")
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(descriptor: int) -> None:
        events.append(Path(os.readlink(f"/proc/self/fd/{descriptor}")).name
                      if os.path.exists("/proc/self/fd") else "fd")
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    assert fmt(str(path))[0] == 0
    assert len(events) == 2
    if events[0] != "fd":
        assert events[0].startswith(".a.tvp.") and events[1] == "a.tvp"


def test_a_failed_copy_writes_the_original_back(fmt, tmp_path: Path, monkeypatch) -> None:
    path = plan(tmp_path / "a.tvp")
    real_put = fmt_cmd._put
    calls: list[bytes] = []

    def put_then_fail(handle, data: bytes) -> None:
        calls.append(data)
        if len(calls) == 1:  # half the new text, then a full disk
            handle.seek(0)
            handle.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real_put(handle, data)

    monkeypatch.setattr(fmt_cmd, "_put", put_then_fail)
    status, _, err = fmt(str(path))
    assert status == 1
    assert f"tvp fmt: cannot write {path}: No space left on device" in err
    assert path.read_text(encoding="utf-8") == MESSY
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tvp"]


def test_a_syntax_error_touches_nothing(fmt, tmp_path: Path) -> None:
    path = plan(tmp_path / "a.tvp", MESSY + "split x [dp,\n")
    before = path.stat()
    assert fmt(str(path))[0] == 1
    after = path.stat()
    assert (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns, before.st_ino)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tvp"]
