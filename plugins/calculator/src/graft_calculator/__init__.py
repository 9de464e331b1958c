"""graft-calculator: a multi-turn calculator tool environment for Graft (entry point
``calculator``): the model calls the ``calculator`` tool in its chat template's format (Hermes
``<tool_call>`` by default, `CalculatorTools`), or writes ``<calc>expr</calc>`` answered by
``<result>value</result>`` (``features.calculator.format=calc``, `CalculatorEnvironment`), and
the final answer is rewarded (``calculator`` reward).
"""

from graft_calculator.arithmetic import NotArithmetic, evaluate
from graft_calculator.config import CalculatorConfig
from graft_calculator.environment import CalculatorEnvironment, CalculatorTools, calculator
from graft_calculator.problems import DATA_SOURCE, problems, write_problems
from graft_calculator.reward import calculator_reward

__version__ = "0.1.0"

__all__ = ["DATA_SOURCE", "CalculatorConfig", "CalculatorEnvironment", "CalculatorTools",
           "NotArithmetic", "__version__", "calculator", "calculator_reward", "evaluate",
           "problems", "write_problems"]
