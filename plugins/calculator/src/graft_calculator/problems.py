"""Arithmetic problems as a Graft dataset (``data.source=file``): JSONL rows with ``prompt``,
``answer`` and ``data_source`` (`DATA_SOURCE`, which ``algorithm.reward=auto`` scores with the
``calculator`` reward).

``python -m graft_calculator train.jsonl --count 512 --seed 0`` writes them.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from graft_calculator.arithmetic import evaluate, render

DATA_SOURCE = "graft/calculator"
INSTRUCTIONS = ("Compute {expression}. You may use a calculator: write <calc>expression</calc> "
                "and it answers <result>value</result>. Then give the answer alone.")


def problem(rng: random.Random, *, operands: int, max_operand: int, operators: str,
            instructions: bool) -> dict[str, str]:
    """One problem: ``operands`` numbers in ``[0, max_operand]`` joined by ``operators``."""
    numbers = [str(rng.randint(0, max_operand)) for _ in range(operands)]
    expression = numbers[0]
    for number in numbers[1:]:
        expression += rng.choice(operators) + number
    prompt = INSTRUCTIONS.format(expression=expression) if instructions else f"{expression}="
    return {"prompt": prompt, "answer": render(evaluate(expression)), "data_source": DATA_SOURCE}


def problems(count: int, *, seed: int = 0, operands: int = 2, max_operand: int = 99,
             operators: str = "+-*", instructions: bool = False) -> list[dict[str, str]]:
    """``count`` problems drawn with ``seed``; ``instructions`` explains the tool in the prompt
    (for instruction-tuned models; without it a prompt is ``12*7=``)."""
    rng = random.Random(seed)
    return [problem(rng, operands=operands, max_operand=max_operand, operators=operators,
                    instructions=instructions) for _ in range(count)]


def write_problems(path: str | Path, count: int, **options: object) -> Path:
    """`problems` as JSONL at ``path``; returns the path."""
    target = Path(path)
    rows = problems(count, **options)  # type: ignore[arg-type]
    target.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m graft_calculator PATH [--count N] [--seed S] ...``."""
    parser = argparse.ArgumentParser(description="Write arithmetic problems as Graft JSONL.")
    parser.add_argument("path")
    parser.add_argument("--count", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--operands", type=int, default=2)
    parser.add_argument("--max-operand", type=int, default=99)
    parser.add_argument("--operators", default="+-*")
    parser.add_argument("--instructions", action="store_true",
                        help="explain the tool in each prompt (instruction-tuned models)")
    args = parser.parse_args(argv)
    write_problems(args.path, args.count, seed=args.seed, operands=args.operands,
                   max_operand=args.max_operand, operators=args.operators,
                   instructions=args.instructions)
    print(f"wrote {args.count} problems to {args.path}")
    return 0
