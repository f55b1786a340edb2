"""mtpforge: put the multi-token-prediction head back into MLX checkpoints, and prove it worked."""

__version__ = "0.1.0"
