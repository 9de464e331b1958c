"""graft-math: verifiable math rewards for Graft with Hugging Face's math-verify (entry point
``math``).

Importing this package is cheap (no sympy, no math-verify); `math_reward` loads them when it
first scores. `DATA_SOURCES` are the ``data_source`` values ``algorithm.reward=auto`` scores
with it.
"""

from graft_math.config import MathConfig
from graft_math.sources import DATA_SOURCES

__version__ = "0.1.0"

__all__ = ["DATA_SOURCES", "MathConfig", "__version__"]
