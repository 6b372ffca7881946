"""A float32 linear layer on tensor cores to float32 accuracy (three TF32 products each)."""

from .ops import AUTO_MIN_ROWS, GemmPlan, linear_tf32x3, plan_gemm, resolve_linear_backend

__all__ = ["AUTO_MIN_ROWS", "GemmPlan", "linear_tf32x3", "plan_gemm", "resolve_linear_backend"]
