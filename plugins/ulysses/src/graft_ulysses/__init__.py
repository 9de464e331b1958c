"""graft-ulysses: DeepSpeed-Ulysses sequence parallelism for Graft (``features.ulysses.sp_size``)."""

__version__ = "0.1.0"
