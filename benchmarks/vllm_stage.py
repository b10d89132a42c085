"""Stage vLLM 0.26.0 for the GPU machine (no network, at most 64 MiB a transfer): docs/vllm.md.

Here (with PyPI), ``download`` walks vLLM's dependencies itself (pip's resolver would also pull torch and its
CUDA libraries, which the GPU machine has): each level's requirements are fetched with ``pip download
--no-deps`` as cp312 manylinux x86_64 wheels, their ``Requires-Dist`` read from the wheel (markers evaluated
for Python 3.12 on Linux x86_64, extras followed), and a package already on the GPU machine (``--present``: a
``pip list`` / ``pip freeze`` of it, or the default guess ``benchmarks/vllm_gpu_present.txt``; ``*`` patterns
allowed) or skipped on purpose (``--skip``) is not fetched. ``split`` cuts the wheels into parts of at most
``--part-mb`` MiB (48: a transfer carries 64 MiB with the repository's ~12 MiB) in folders ``.vllmA/``,
``.vllmB/``, … (gitignored), with a manifest (sha256 of every wheel)
in each. On the GPU machine ``benchmarks/vllm_device.sh`` copies each part out of the work tree as it arrives,
joins the wheels, checks them against the manifest, installs them with ``pip --no-index --no-deps --target`` and
checks that ``import vllm`` and its compiled extensions (``vllm._C_stable_libtorch``, built against
CUDA 13's ``libcudart.so.13``; ``vllm.cumem_allocator`` for sleep mode) load against the machine's torch.

    python benchmarks/vllm_stage.py download --dest /tmp/vllm-wheels [--present pip-list.txt]
    python benchmarks/vllm_stage.py split --src /tmp/vllm-wheels                   # -> .vllmA/ .vllmB/ …
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PRESENT = Path(__file__).with_name("vllm_gpu_present.txt")
# audio and video decoding only (text models never import them); torchaudio/torchcodec must match the torch build
DEFAULT_SKIP = ("torchaudio", "torchcodec", "pynvvideocodec")
# --profile minimal (the default) also leaves out what dense text models (Llama, Qwen2) never import, each
# imported lazily by vLLM where it is used: MLA prefill kernels (tokenspeed-*), video decoding (opencv),
# TileLang kernels and their solver (tilelang, z3-solver), CUTLASS DSL's CUDA 12 libraries (the machine runs CUDA 13),
# the CUDA compiler as wheels (humming kernels' JIT: the image has nvcc itself)
MINIMAL_SKIP = (
    "tokenspeed-mla", "tokenspeed-triton", "opencv-python-headless", "tilelang", "z3-solver",
    "nvidia-cutlass-dsl-libs-cu12", "nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-cccl",
)  # fmt: skip
# where the newest release of a dependency breaks a pin of vLLM 0.26.0's (pip's resolver backs off the same
# way): xgrammar 0.2.8 and nvidia-cudnn-frontend >= 1.29 need apache-tvm-ffi >= 0.1.11 (vLLM pins 0.1.10);
# quack-kernels >= 0.5 and cudnn-frontend >= 1.29 need nvidia-cutlass-dsl >= 4.6.x/4.7 (vLLM pins 4.6.0);
# the CUTLASS DSL libraries need protobuf < 7
DEFAULT_CONSTRAINTS = ("xgrammar<0.2.8", "nvidia-cudnn-frontend<1.29", "quack-kernels<0.5", "protobuf<7")
PLATFORM = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
    "--abi", "none", "--platform", "manylinux_2_35_x86_64", "--platform", "manylinux_2_34_x86_64",
    "--platform", "manylinux_2_33_x86_64", "--platform", "manylinux_2_32_x86_64", "--platform", "manylinux_2_31_x86_64",
    "--platform", "manylinux_2_30_x86_64", "--platform", "manylinux_2_29_x86_64",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
    "--platform", "manylinux_2_24_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
    "--platform", "manylinux_2_5_x86_64", "--platform", "manylinux1_x86_64", "--platform", "linux_x86_64",
    "--platform", "any",
]  # fmt: skip
MARKER_ENV = {
    "python_version": "3.12", "python_full_version": "3.12.3", "platform_system": "Linux",
    "platform_machine": "x86_64", "sys_platform": "linux", "os_name": "posix", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "platform_release": "", "platform_version": "",
    "implementation_version": "3.12.3",
}  # fmt: skip


def present_names(path: Path) -> list[str]:
    """Package names (or ``*`` patterns) from a ``pip list`` / ``pip freeze`` / one-name-a-line file."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith(("Package", "---")):
            continue
        name = re.split(r"[\s=<>@;\[]", line, maxsplit=1)[0]
        names.append(name if "*" in name else canonicalize_name(name))
    return names


def excluded(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(canonicalize_name(name), p.lower()) for p in patterns)


def wheel_requirements(wheel: Path, extras: set[str]) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` that apply on the GPU machine with ``extras`` asked for."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    out = []
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or _applies(req.marker, extras):
            out.append(req)
    return out


def _applies(marker: Marker, extras: set[str]) -> bool:
    return any(marker.evaluate({**MARKER_ENV, "extra": e}) for e in ({""} | extras))


def download(
    dest: Path, root: str, patterns: list[str], constraints: tuple[str, ...] = DEFAULT_CONSTRAINTS
) -> dict[str, dict[str, object]]:
    """Breadth-first over the requirements of ``root``: one ``pip download --no-deps`` call a level;
    ``constraints`` narrow a package's versions wherever it is asked for."""
    narrow = {canonicalize_name(Requirement(c).name): Requirement(c).specifier for c in constraints}
    dest.mkdir(parents=True, exist_ok=True)
    got: dict[str, dict[str, object]] = {}
    extras: dict[str, set[str]] = {}
    level = [Requirement(root)]
    while level:
        todo: dict[str, Requirement] = {}
        for req in level:
            name = canonicalize_name(req.name)
            if excluded(name, patterns):
                continue
            if name in got:  # a later parent: check its pin against the wheel already chosen
                if req.specifier and not req.specifier.contains(str(got[name]["version"]), prereleases=True):
                    print(f"warning: {name} {got[name]['version']} does not meet {req}", file=sys.stderr)
                new = set(req.extras) - extras.get(name, set())
                if new:  # an extra asked for later: its requirements join the next level
                    extras.setdefault(name, set()).update(new)
                    level_extra = wheel_requirements(Path(str(got[name]["wheel"])), new)
                    todo.update({f"{canonicalize_name(r.name)}#x": r for r in level_extra})
                continue
            extras.setdefault(name, set()).update(req.extras)
            todo.setdefault(name, req)
        fresh = {k: r for k, r in todo.items() if not k.endswith("#x")}
        if fresh:
            specs = [f"{r.name}{r.specifier & narrow.get(n, r.specifier)}" for n, r in fresh.items()]
            before = {p.name for p in dest.glob("*.whl")}
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                str(dest),
                *PLATFORM,
                *specs,
            ]
            subprocess.run(cmd, check=True)
            wheels = {}
            for p in dest.glob("*.whl"):  # (several versions may lie there: the one the specs allow)
                name, version = (
                    canonicalize_name(parse_wheel_filename(p.name)[0]),
                    parse_wheel_filename(p.name)[1],
                )
                req = fresh.get(name)
                fits = req is not None and (req.specifier & narrow.get(name, req.specifier)).contains(
                    version, True
                )
                if fits and (name not in wheels or version > parse_wheel_filename(wheels[name].name)[1]):
                    wheels[name] = p
            for name in fresh:
                wheel = wheels.get(name)
                if wheel is None:
                    raise SystemExit(f"pip downloaded no wheel for {name} ({fresh[name]})")
                got[name] = {
                    "version": str(parse_wheel_filename(wheel.name)[1]),
                    "wheel": str(wheel),
                    "bytes": wheel.stat().st_size,
                    "new": wheel.name not in before,
                }
        nxt: list[Requirement] = []
        for key, req in todo.items():
            name = canonicalize_name(req.name)
            if key.endswith("#x"):
                nxt.append(req)
            elif name in got:
                nxt += wheel_requirements(Path(str(got[name]["wheel"])), extras.get(name, set()))
        level = nxt
    return got


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split(src: Path, out_root: Path, part_mb: int, prefix: str = ".vllm") -> list[Path]:
    """Every wheel of ``src`` into folders ``{prefix}A``, ``{prefix}B``, … of at most ``part_mb`` MiB; a wheel
    larger than what is left of a folder is cut into pieces (``NAME.part000``, …) across folders."""
    limit = part_mb << 20
    wheels = sorted(src.glob("*.whl"), key=lambda p: -p.stat().st_size)
    manifest = {p.name: {"sha256": sha256(p), "bytes": p.stat().st_size} for p in wheels}
    folders: list[Path] = []
    room = 0

    def next_folder() -> Path:
        nonlocal room
        name = prefix + _letters(len(folders))
        folder = out_root / name
        if folder.exists():
            for old in folder.iterdir():
                old.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        folders.append(folder)
        room = limit - 64 * 1024  # (the manifest)
        return folder

    folder = next_folder()
    for wheel in wheels:
        data_left, offset, piece = wheel.stat().st_size, 0, 0
        whole = data_left <= room
        with wheel.open("rb") as f:
            while data_left > 0:
                if room <= 0:
                    folder = next_folder()
                take = min(room, data_left)
                name = wheel.name if whole else f"{wheel.name}.part{piece:03d}"
                f.seek(offset)
                (folder / name).write_bytes(f.read(take))
                offset, data_left, room, piece = offset + take, data_left - take, room - take, piece + 1
    for folder in folders:
        (folder / "MANIFEST.json").write_text(
            json.dumps({"parts": len(folders), "wheels": manifest}, indent=1)
        )
    return folders


def _letters(i: int) -> str:
    """A, B, …, Z, AA, AB, …"""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = chr(65 + r) + out
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="fetch vLLM and the dependencies the GPU machine lacks")
    d.add_argument("--dest", type=Path, default=Path("/tmp/vllm-wheels"))
    d.add_argument("--root", default="vllm==0.26.0")
    d.add_argument("--present", type=Path, default=DEFAULT_PRESENT, help="pip list of the GPU machine")
    d.add_argument("--skip", default=",".join(DEFAULT_SKIP), help="names not to stage (comma-separated)")
    d.add_argument(
        "--profile", choices=("minimal", "full"), default="minimal", help="minimal: see MINIMAL_SKIP"
    )
    s = sub.add_parser("split", help="cut the wheels into .vllmA/, .vllmB/, … of at most --part-mb MiB each")
    s.add_argument("--src", type=Path, default=Path("/tmp/vllm-wheels"))
    s.add_argument("--out", type=Path, default=ROOT)
    s.add_argument("--part-mb", type=int, default=48, help="the repo (~12 MiB) travels too: 64 MiB in all")
    args = ap.parse_args(argv)
    if args.cmd == "download":
        skip = [n for n in args.skip.split(",") if n] + (
            list(MINIMAL_SKIP) if args.profile == "minimal" else []
        )
        patterns = present_names(args.present) + [canonicalize_name(n) for n in skip]
        got = download(args.dest, args.root, patterns)
        total = sum(int(v["bytes"]) for v in got.values())  # type: ignore[call-overload]
        for name, v in sorted(got.items(), key=lambda kv: -int(kv[1]["bytes"])):  # type: ignore[call-overload]
            print(f"{int(v['bytes']) / 2**20:9.1f} MiB  {name}=={v['version']}")  # type: ignore[call-overload]
        parts = -(-total // ((48 << 20) - 64 * 1024))
        print(f"{len(got)} wheels, {total / 2**20:.1f} MiB: {parts} parts of <= 48 MiB")
        (args.dest / "STAGED.json").write_text(json.dumps(got, indent=1))
    else:
        folders = split(args.src, args.out, args.part_mb)
        print(" ".join(f.name for f in folders))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
