"""The accelerator a benchmark ran on, in the words its results quote (``NVIDIA H100 80GB HBM3 x1``)."""

from __future__ import annotations

import os
import platform


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except ImportError:
        pass
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
