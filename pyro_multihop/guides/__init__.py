"""Variational guides and KL annealing for the heads with continuous latents (the tied-embedding head)."""

from .annealing import DEFAULT_PRIOR_STRENGTH, AnnealingSchedule, Constant, LinearAnnealing, check_kl_weight, make_schedule, scale_kl
from .mean_field import MeanFieldNormalGuide

__all__ = [
    "DEFAULT_PRIOR_STRENGTH",
    "AnnealingSchedule",
    "LinearAnnealing",
    "Constant",
    "make_schedule",
    "scale_kl",
    "check_kl_weight",
    "MeanFieldNormalGuide",
]
