"""Joins staged wheels on the GPU machine (standard library only: it runs before anything is installed).

    python3 benchmarks/join_parts.py PARTS WHEELS

PARTS holds MANIFEST.json ({"wheels": {name: {"bytes", "sha256"}}}, written by vllm_stage.py / ray_stage.py
`split`) and each wheel whole or cut into NAME.partNN pieces, gathered from several transfers; each wheel is
joined into WHEELS and checked against its size and sha256. Exits non-zero, naming them, when wheels are
missing or incomplete (a part not taken yet).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def join(parts: Path, wheels: Path) -> list[str]:
    """Writes every complete, checked wheel of the manifest into `wheels`; returns the missing or bad ones."""
    manifest = json.loads((parts / "MANIFEST.json").read_text())
    wheels.mkdir(parents=True, exist_ok=True)
    missing = []
    for name, info in manifest["wheels"].items():
        pieces = sorted(parts.glob(name + ".part*"))
        if (parts / name).is_file():
            data = (parts / name).read_bytes()
        elif pieces:
            data = b"".join(p.read_bytes() for p in pieces)
        else:
            missing.append(name)
            continue
        if len(data) != info["bytes"] or hashlib.sha256(data).hexdigest() != info["sha256"]:
            missing.append(f"{name} ({len(data)} of {info['bytes']} bytes)")
            continue
        (wheels / name).write_bytes(data)
    return missing


def main(argv: list[str]) -> int:
    parts, wheels = Path(argv[0]), Path(argv[1])
    missing = join(parts, wheels)
    if missing:
        print(
            f"{len(missing)} wheels missing or incomplete (a part not taken yet?): " + ", ".join(missing[:8]),
            file=sys.stderr,
        )
        return 1
    print(
        f"{len(json.loads((parts / 'MANIFEST.json').read_text())['wheels'])} wheels joined and checked in {wheels}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
