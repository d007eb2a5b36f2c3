"""The CPU demo's task: two-operand addition questions ("What is 7+12?" -> "19") and noisy demonstrations.

`scripts/make_arithmetic_data.py` writes the shipped train/validation files with `make_arithmetic_splits`;
`demo/arithmetic_policy.py` warms the demo policy up on `make_demonstrations`, of which a fraction is wrong, so
that PPO starts from a competent-but-imperfect policy that a correctness reward can improve.
"""

import random
from dataclasses import dataclass
from typing import Any

from asyncppo.demo.splits import disjoint_splits

# Operands 0..19 give 400 problems whose answers are one or two digit tokens plus eos. The tiny model
# learns carries over this range in a ~20 s warm-up; at 0..49 the same warm-up stays near 30% greedy accuracy.
DEFAULT_MAX_OPERAND = 19
# The shipped split (scripts/make_arithmetic_data.py) and the demo policy's warm-up both use these, so the
# warm-up never sees a validation problem. 64 validation rows = the demo's max_val_samples.
DEMO_NUM_VALIDATION = 64
DEMO_SPLIT_SEED = 0


@dataclass(frozen=True)
class AdditionProblem:
    """`left + right`; its question and answer are the text of a dataset row."""

    left: int
    right: int

    @property
    def question(self) -> str:
        return f"What is {self.left}+{self.right}?"

    @property
    def answer(self) -> str:
        return str(self.left + self.right)

    def row(self) -> dict[str, Any]:
        """The dataset row: the plain-text `prompt` and the reference `answer` the reward compares to."""
        return {"prompt": self.question, "answer": self.answer}


def all_problems(max_operand: int = DEFAULT_MAX_OPERAND) -> list[AdditionProblem]:
    """Every pair of operands in 0..max_operand, in (left, right) order."""
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    return [AdditionProblem(left, right) for left in range(max_operand + 1) for right in range(max_operand + 1)]


def make_arithmetic_splits(
    num_validation: int, seed: int, max_operand: int = DEFAULT_MAX_OPERAND, num_train: int | None = None
) -> tuple[list[AdditionProblem], list[AdditionProblem]]:
    """(train, validation) addition problems: see splits.disjoint_splits."""
    problems = all_problems(max_operand)
    return disjoint_splits(problems, num_validation, seed, num_train, f" with operands 0..{max_operand}")


def wrong_answer(problem: AdditionProblem, rng: random.Random) -> str:
    """A plausible mistake, never the right answer: off by one, or one digit slipped by one.

    These are the errors a correctness reward must learn to remove; they stay well-formed numbers, so the
    warm-up teaches the format perfectly and only the content is noisy.
    """
    total = problem.left + problem.right
    digits = list(str(total))
    if len(digits) == 1 or rng.random() < 0.5:
        # Off by one; at 0 only +1 keeps the answer non-negative.
        return str(total + 1 if total == 0 or rng.random() < 0.5 else total - 1)
    # Digit slip in the tens or units place; the leading digit never becomes 0 (a malformed number).
    position = rng.randrange(len(digits))
    lowest = 1 if position == 0 else 0
    digit = int(digits[position])
    digits[position] = str(rng.choice([d for d in (digit - 1, digit + 1) if lowest <= d <= 9]))
    return "".join(digits)


@dataclass(frozen=True)
class Demonstration:
    """One supervised example: the question and the answer shown for it (possibly wrong)."""

    question: str
    answer: str
    is_correct: bool


def make_demonstrations(
    problems: list[AdditionProblem], num_demonstrations: int, wrong_fraction: float, seed: int
) -> list[Demonstration]:
    """`num_demonstrations` examples drawn with replacement from `problems`, each wrong with prob wrong_fraction.

    The choice is made per example (not per problem), so a problem seen several times gets a mixture of
    answers and the warm-up learns p(right answer) ~ 1 - wrong_fraction rather than memorising one mistake.
    """
    if not problems:
        raise ValueError("make_demonstrations needs at least one problem")
    if not 0.0 <= wrong_fraction < 1.0:
        raise ValueError(f"wrong_fraction must be in [0, 1), got {wrong_fraction}")
    rng = random.Random(seed)
    demonstrations = []
    for _ in range(num_demonstrations):
        problem = rng.choice(problems)
        if rng.random() < wrong_fraction:
            demonstrations.append(Demonstration(problem.question, wrong_answer(problem, rng), is_correct=False))
        else:
            demonstrations.append(Demonstration(problem.question, problem.answer, is_correct=True))
    return demonstrations


def is_correct_answer(response: str, answer: str) -> bool:
    """Exact match after trimming surrounding whitespace: the demo's notion of a right answer."""
    return response.strip() == answer.strip()
