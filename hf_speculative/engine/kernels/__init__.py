"""Kernels for the engine's forwards: the target's linear layers at the machine's cost (`linear`), built for this
CPU where they are C (`build`)."""

from .linear import KERNELS_ENV, ROW_BUCKETS, KernelTable, LinearKernel, available_kernels, default_kernel_table, engine_kernels, fast_linear, head_projector, kernel_for_rows, kernel_table, kernel_table_path, kernels_setting, measure_kernel_table, native_bf16, prepare_kernels, set_kernel_table

__all__ = [
    "KERNELS_ENV", "ROW_BUCKETS", "KernelTable", "LinearKernel", "available_kernels", "default_kernel_table",
    "engine_kernels", "fast_linear", "head_projector", "kernel_for_rows", "kernel_table", "kernel_table_path",
    "kernels_setting", "measure_kernel_table", "native_bf16", "prepare_kernels", "set_kernel_table",
]  # fmt: skip
