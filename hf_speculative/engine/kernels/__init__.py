"""Kernels for the engine's forwards: the target's linear layers at the machine's cost, reading the weights in place
(`linear`), built for this CPU and checked where they are C (`build`). Which kernel runs when is the speed policy's
choice (`hf_speculative.engine.policy`)."""

from .linear import (
    ROW_BUCKETS,
    DirectKernel,
    KernelTable,
    LinearKernel,
    OneDnnKernel,
    available_kernels,
    default_kernel_table,
    fast_linear,
    kernel_table_path,
    linear_layers,
    measure_kernel_table,
    native_bf16,
    read_kernel_table,
    verify_kernel,
)

__all__ = [
    "ROW_BUCKETS",
    "DirectKernel",
    "KernelTable",
    "LinearKernel",
    "OneDnnKernel",
    "available_kernels",
    "default_kernel_table",
    "fast_linear",
    "kernel_table_path",
    "linear_layers",
    "measure_kernel_table",
    "native_bf16",
    "read_kernel_table",
    "verify_kernel",
]
