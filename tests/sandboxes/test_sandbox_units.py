"""Unit tests that need no sandbox: frames, the docker stream demultiplexer, limits, backend choice, CLI."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from toolgym.errors import ConfigError
from toolgym.sandboxes import Limits, get_sandbox
from toolgym.sandboxes.channel import DockerExecChannel
from toolgym.sandboxes.inside.frames import decode, encode, split


def test_frames_round_trip_binary_blobs() -> None:
    header, blobs = decode(*split(encode({"op": "run", "timeout": 1.5}, {"code": b"\xff\x00", "stdin": b""})))
    assert header == {"op": "run", "timeout": 1.5}
    assert blobs == {"code": b"\xff\x00", "stdin": b""}


def test_docker_stream_demultiplexing_keeps_stdout_and_sets_stderr_aside() -> None:
    a, b = socket.socketpair()
    frame = encode({"ok": True}, {"stdout": b"hi"})

    def piece(stream: int, data: bytes) -> bytes:
        return struct.pack(">BxxxI", stream, len(data)) + data

    # A frame split across two stdout pieces with a stderr piece in between, sent in odd chunks.
    wire = piece(1, frame[:5]) + piece(2, b"warning") + piece(1, frame[5:])
    for i in range(0, len(wire), 3):
        b.sendall(wire[i : i + 3])
    ch = DockerExecChannel(a)
    got = ch._take(len(frame), deadline=time.monotonic() + 5)
    assert decode(*split(got)) == ({"ok": True}, {"stdout": b"hi"})
    assert ch.stderr_tail == b"warning"
    a.close()
    b.close()


def test_limits_reject_unknown_and_bad_values() -> None:
    with pytest.raises(ConfigError, match="known"):
        Limits().updated(memroy_mb=1)
    with pytest.raises(ConfigError, match="positive"):
        Limits(memory_mb=0)
    assert Limits(pool_size=3).size == 3


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        get_sandbox("vm")


def test_cli_registers_build_and_doctor() -> None:
    from toolgym.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["sandbox", "build", "--debootstrap", "--force"])
    assert args.debootstrap and args.force and args.func.__name__ == "cmd_build"
    assert parser.parse_args(["sandbox", "doctor"]).func.__name__ == "cmd_doctor"
    assert parser.parse_args(["sandbox", "doctor", "--prune"]).prune
    assert parser.parse_args(["sandbox", "doctor", "--clean"]).prune  # the older name
    args = parser.parse_args(["sandbox", "doctor", "--prune", "--all-hosts"])
    assert args.prune and args.all_hosts
    assert not parser.parse_args(["sandbox", "doctor", "--prune"]).all_hosts  # this host's only by default


def test_doctor_all_hosts_without_prune_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """``--all-hosts`` only widens ``--prune``: alone it is a usage error before anything is checked."""
    from toolgym.cli import build_parser

    args = build_parser().parse_args(["sandbox", "doctor", "--all-hosts"])
    assert args.func(args) == 2
    assert "--all-hosts goes with --prune" in capsys.readouterr().out


def test_importing_toolgym_does_not_import_docker() -> None:
    import subprocess
    import sys

    code = "import toolgym, toolgym.sandboxes, toolgym.cli, sys; print('docker' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_preload_is_shared_by_every_run() -> None:
    sb = get_sandbox("process", preload="json,fractions", pool_size=1)
    try:
        res = sb.run("import sys\nprint('fractions' in sys.modules)", timeout=10)
        assert res.stdout == "True\n", res
    finally:
        sb.close()
