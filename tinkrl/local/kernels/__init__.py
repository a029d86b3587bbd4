"""The sampler's fast paths: C kernels (`kernels.c`, built by `library.py`), their torch-facing calls
(`ops.py`) and the paths through a model that use them (`paths.py`: `Reference`, `CpuKernels`,
`for_plan`), each chosen by the engine's compute plan (`tinkrl/local/compute_plan.py`)."""
