"""Staging vLLM for the GPU machine (benchmarks/vllm_stage.py, vllm_device.sh) without the network: the present
list, the split into part folders, and the device side taking the parts one transfer at a time, joining the wheels
(sha256-checked) and installing them with ``pip --no-index --no-deps --target``."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.script_modules import load_script

ROOT = Path(__file__).resolve().parents[2]


def stage() -> Any:
    return load_script("benchmarks/vllm_stage.py")


def make_wheel(folder: Path, name: str, payload: bytes) -> Path:
    """A pure-Python wheel holding one module with ``payload`` (bytes that do not compress) beside it."""
    dist = f"{name}-1.0"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}/__init__.py", "VALUE = 42\n")
        z.writestr(f"{name}/blob.bin", payload)
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def test_present_list_names_and_patterns(tmp_path: Path) -> None:
    mod = stage()
    listing = tmp_path / "pip-list.txt"
    listing.write_text(
        "Package    Version\n---------- -------\nTorch_Vision 0.26.0\nnumpy==2.5.2\nnvidia-cu*\n"
    )
    names = mod.present_names(listing)
    assert names == ["torch-vision", "numpy", "nvidia-cu*"]
    assert (
        mod.excluded("nvidia_cublas", names)
        and mod.excluded("NumPy", names)
        and not mod.excluded("vllm", names)
    )
    default = mod.present_names(mod.DEFAULT_PRESENT)
    assert "torch" in default and "transformers" in default and "vllm" not in default


def test_split_then_take_join_and_install(tmp_path: Path) -> None:
    import os

    mod = stage()
    src = tmp_path / "wheels"
    src.mkdir()
    big = make_wheel(src, "bigpkg", os.urandom(int(2.5 * 2**20)))  # cut across part folders
    make_wheel(src, "smallpkg", os.urandom(1000))
    folders = mod.split(src, tmp_path / "repo", part_mb=1)
    assert [f.name for f in folders] == [".vllmA", ".vllmB", ".vllmC"]
    assert all(sum(p.stat().st_size for p in f.iterdir()) <= 2**20 for f in folders)
    # the device: each transfer brings one folder into the work tree; `take` keeps it outside
    work, parts = tmp_path / "work", tmp_path / "parts"
    env = {**os.environ, "PARTS": str(parts), "WHEELS": str(tmp_path / "joined"), "SITE": str(tmp_path / "site"),
           "PY": sys.executable}  # fmt: skip
    script = ROOT / "benchmarks" / "vllm_device.sh"
    for f in folders:
        if work.exists():
            subprocess.run(["rm", "-rf", str(work)], check=True)
        work.mkdir()
        subprocess.run(["cp", "-r", str(f), str(work)], check=True)
        steps = ["take"] if f is not folders[-1] else ["take", "install"]
        if f is folders[0]:  # joining before every part is there says what is missing
            early = subprocess.run(
                ["bash", str(script), "take", "install"], cwd=work, env=env, capture_output=True, text=True
            )
            assert early.returncode != 0 and "missing or incomplete" in early.stderr + early.stdout
            continue
        done = subprocess.run(
            ["bash", str(script), *steps], cwd=work, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr + done.stdout
    assert (tmp_path / "joined" / big.name).read_bytes() == big.read_bytes()
    check = subprocess.run(
        [sys.executable, "-c", "import bigpkg, smallpkg; print(bigpkg.VALUE + smallpkg.VALUE)"],
        env={**env, "PYTHONPATH": str(tmp_path / "site")}, capture_output=True, text=True,
    )  # fmt: skip
    assert check.stdout.strip() == "84", check.stderr


@pytest.mark.parametrize("bad", ["not-a-step"])
def test_device_script_refuses_unknown_steps(bad: str) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "vllm_device.sh"), bad], capture_output=True, text=True
    )
    assert done.returncode == 2 and "unknown step" in done.stderr
