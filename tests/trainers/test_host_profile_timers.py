"""benchmarks/host_profile.py times the collate calls the GRPO step really makes (grpo.py's batch and
grpo_credit.py's KL-in-reward batch), whichever module's name the call looks up."""

import sys
from pathlib import Path

from tests.processes import run

ROOT = Path(__file__).resolve().parents[2]
CHECK = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("host_profile", {str(ROOT / "benchmarks" / "host_profile.py")!r})
hp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hp)
hp.instrument()
import toolgym.trainers.grpo as grpo
import toolgym.trainers.grpo_credit as grpo_credit
from toolgym.trainers.tree import Row

row = Row(0, 1, (0, 1), [5, 6, 7], [0, 1, 1], [0, 1, 1], [-1, 0, 0], [0.0, -0.5, -0.2], [0.0] * 3)
for module in (grpo, grpo_credit):
    module.collate([row], [[0.0, 1.0, 1.0]], [1.0], [True], 0)
print("collate calls timed:", hp._COUNTS[-1]["collate"])
"""


def test_collate_is_timed_in_every_module_that_calls_it():
    # a fresh interpreter: instrument() patches torch and the trainers for the whole process
    proc = run([sys.executable, "-c", CHECK], timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "collate calls timed: 2" in proc.stdout, proc.stdout
