"""A float32 linear layer on tensor cores to float32 accuracy (three TF32 products each)."""

from .ops import GemmPlan, linear_tf32x3, plan_gemm, resolve_linear_backend

__all__ = ["GemmPlan", "linear_tf32x3", "plan_gemm", "resolve_linear_backend"]
