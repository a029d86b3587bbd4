"""The embedded engine: the Tinker API in-process (PyTorch + LoRA, CPU or CUDA)."""

from tinkrl.local.futures import LocalFuture
from tinkrl.local.service import SamplingClient, ServiceClient, TrainingClient

__all__ = ["ServiceClient", "TrainingClient", "SamplingClient", "LocalFuture"]
