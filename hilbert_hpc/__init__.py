"""hilbert_hpc: Hilbert-ordered dilated attention over very long sequences, sharded across MPI ranks."""

from __future__ import annotations

__version__ = "0.1.0"

from .attention import dilated_attention
from .errors import ConfigError, JobFileError, UserError
from .ordering import ORDERINGS, inverse_order, serialization_order
from .patterns import Pattern, useful_flops

__all__ = [
    "__version__",
    "dilated_attention",
    "serialization_order",
    "inverse_order",
    "ORDERINGS",
    "Pattern",
    "useful_flops",
    "UserError",
    "ConfigError",
    "JobFileError",
]
