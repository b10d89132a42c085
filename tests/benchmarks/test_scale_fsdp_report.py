"""benchmarks/scale_fsdp.py --report (issue 32): ``--all`` outputs into scale_fsdp.{md,json} and the
``update_<model>_<g>gpu`` keys of scale.json, on synthetic outputs (no GPU, no torchrun)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.script_modules import load_script


def load() -> ModuleType:
    return load_script("benchmarks/scale_fsdp.py", "bench_scale_fsdp")


def ok(variant: str, step_s: float, sync_s: float, peak: float) -> dict[str, Any]:
    return {"variant": variant, "model": "qwen2.5-7b", "gpus": 2, "rows": 64, "max_len": 1024,
            "micro_batch_rows": 2, "result": "ok", "params": 7_615_616_512, "step_s": step_s,
            "tokens_per_s": 36727.0 / step_s, "mfu": 0.1455, "weight_sync_s": sync_s,
            "peak_gb_rank0": peak}  # fmt: skip


# as the first GPU run wrote it: no command, no machine, no gradient_checkpointing in the variants
SEVEN = {
    "model": "qwen2.5-7b",
    "gpus": 2,
    "variants": {
        "fsdp2": ok("fsdp2", 5.8326, 0.12898, 84.316),
        "ddp": {
            "variant": "ddp",
            "model": "qwen2.5-7b",
            "gpus": 2,
            "rows": 64,
            "max_len": 1024,
            "micro_batch_rows": 2,
            "result": "oom",
            "error": "CUDA out of memory. Tried to allocate 2.03 GiB. | GPU 0\nsecond line",
        },
        "fsdp2_offload": {"variant": "fsdp2_offload", "result": "failed", "error": "timeout"},
    },
}
COMMAND = "python3 benchmarks/scale_fsdp.py --all --model qwen2.5-7b --gpus 2 --micro 2 --checkpointing --timeout 120"


def test_report_rows_errors_and_scale_keys(tmp_path: Path) -> None:
    mod = load()
    (tmp_path / "scale.json").write_text(json.dumps({"env_workers_speedup": {"speedup": 0.64}}))
    mod.write_report([SEVEN], tmp_path, machine="2 x NVIDIA H200", command=COMMAND)
    md = (tmp_path / "scale_fsdp.md").read_text()
    assert "a GRPO update step (`grpo_update.optimize`" in md and "Per variant (`ddp`" in md
    assert f"Command: `{COMMAND}`" in md
    assert "`qwen2.5-7b_2gpu`: 2 x NVIDIA H200; 64 rows of up to 1024 tokens" in md
    assert "gradient checkpointing on" in md  # from the command: the variants did not record it
    assert "| qwen2.5-7b | 2 | fsdp2 | ok | 5.83 | 6297 | 0.145 | 0.129 | 84.3 |" in md
    # the first line only, a pipe escaped so the table holds
    assert (
        "| qwen2.5-7b | 2 | ddp | oom: CUDA out of memory. Tried to allocate 2.03 GiB. \\| GPU 0 | - | - |"
        in md
    )
    assert "second line" not in md
    assert (
        "| qwen2.5-7b | 2 | fsdp2_offload | failed: no result within 120 s (timeout) | - | - | - | - | - |"
        in md
    )
    assert "`fits_7b_2gpu`" in md and "84 GB peak" in md and "`fsdp2_offload` variant's step time" in md
    scale = json.loads((tmp_path / "scale.json").read_text())
    assert scale["env_workers_speedup"] == {"speedup": 0.64}
    assert "fits_7b_2gpu" not in scale and "step_s_7b_2gpu" not in scale and "weight_sync_s_7b" not in scale
    key = scale["update_qwen2.5-7b_2gpu"]
    assert key["fits"] == ["fsdp2"] and key["oom"] == ["ddp"] and key["failed"] == ["fsdp2_offload"]
    assert key["variant"] == "fsdp2" and key["step_s"] == 5.8326 and key["weight_sync_s"] == 0.12898
    stored = json.loads((tmp_path / "scale_fsdp.json").read_text())
    assert stored["qwen2.5-7b_2gpu"]["machine"] == "2 x NVIDIA H200"
    assert stored["qwen2.5-7b_2gpu"]["command"] == COMMAND


def test_a_second_report_adds_rows(tmp_path: Path) -> None:
    mod = load()
    mod.write_report([SEVEN], tmp_path, machine="2 x NVIDIA H200", command=COMMAND)
    # a later --all output records its own command and machine; ddp fits, fsdp2 is still preferred
    small = {
        "model": "qwen2.5-1.5b",
        "gpus": 1,
        "command": "python benchmarks/scale_fsdp.py --all --model qwen2.5-1.5b --gpus 1",
        "machine": {
            "torch": "2.11",
            "cuda": "13.0",
            "gpu": "NVIDIA H100",
            "gpu_count": 1,
            "gpu_memory_mib": 81559,
        },
        "variants": {
            "ddp": {**ok("ddp", 1.5, 0.0, 30.0), "model": "qwen2.5-1.5b", "gpus": 1},
            "fsdp2": {
                **ok("fsdp2", 1.7, 0.05, 33.0),
                "model": "qwen2.5-1.5b",
                "gpus": 1,
                "gradient_checkpointing": False,
            },
        },
    }
    mod.write_report([small], tmp_path)
    md = (tmp_path / "scale_fsdp.md").read_text()
    assert "| qwen2.5-7b | 2 | fsdp2 | ok | 5.83 |" in md  # the first report's rows kept
    assert "| qwen2.5-1.5b | 1 | ddp | ok | 1.50 |" in md and "| qwen2.5-1.5b | 1 | fsdp2 | ok | 1.70 |" in md
    assert "`qwen2.5-1.5b_1gpu`: 1 x NVIDIA H100, 81559 MiB each, torch 2.11 CUDA 13.0;" in md
    assert "gradient checkpointing off" in md
    stored = json.loads((tmp_path / "scale_fsdp.json").read_text())
    assert sorted(stored) == ["qwen2.5-1.5b_1gpu", "qwen2.5-7b_2gpu"]
    scale = json.loads((tmp_path / "scale.json").read_text())
    assert scale["update_qwen2.5-7b_2gpu"]["fits"] == ["fsdp2"]
    small_key = scale["update_qwen2.5-1.5b_1gpu"]
    assert small_key["fits"] == ["ddp", "fsdp2"] and small_key["oom"] == []
    assert small_key["variant"] == "fsdp2" and small_key["step_s"] == 1.7
