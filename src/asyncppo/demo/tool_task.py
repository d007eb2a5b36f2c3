"""The multi-step tool demo's task: compute (a + b) * c with an `add` and a `multiply` tool, in three turns.

`scripts/make_tool_task_data.py` writes the shipped gym rows with `make_tool_task_splits`; the warm-up of
`demo/tool_policy.py` trains on `make_demonstrations` (a fraction of them wrong) and measures itself
with `parse_generation`, `call_tool` and `reward`, which mirror the policy server, the gym's tools and its
verify. A correct play, as the chat template renders it (the model generates each assistant text + <|im_end|>):

    user       Compute (12 + 7) * 3. Use the add and multiply tools.
    assistant  <tool_call>\\n{"name": "add", "arguments": {"a": 12, "b": 7}}\\n</tool_call>
    tool       <tool_response>\\n{"result":19}\\n</tool_response>
    assistant  <tool_call>\\n{"name": "multiply", "arguments": {"a": 19, "b": 3}}\\n</tool_call>
    tool       <tool_response>\\n{"result":57}\\n</tool_response>
    assistant  57

Every step is a copy (operands from the question, results from the tool responses), which a two-layer model
learns; the arithmetic itself is the tools' job. Rows carry no tool schemas: rendered into the prompt they
would make the sequences too long for the tiny model, which learns the tools from the demonstrations.
"""

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Literal

from asyncppo.demo.splits import disjoint_splits

# a, b in 1..20 and c in 2..9: 3200 problems, sums of one or two digits and products of one to three.
DEFAULT_MAX_ADDEND = 20
DEFAULT_MIN_MULTIPLIER = 2
DEFAULT_MAX_MULTIPLIER = 9
# The shipped split (scripts/make_tool_task_data.py) and the warm-up both use these, so the warm-up never
# sees a validation problem.
DEMO_NUM_VALIDATION = 64
DEMO_SPLIT_SEED = 0
AGENT_REF = {"type": "responses_api_agents", "name": "multi_step_simple_agent"}

# What a demonstration gets wrong: nothing, the final answer, or the add result copied into multiply.
Mistake = Literal["none", "answer", "copy"]


@dataclass(frozen=True)
class ChainProblem:
    """`(a + b) * c`; its question and answer are the text of a gym row."""

    a: int
    b: int
    c: int

    @property
    def question(self) -> str:
        return f"Compute ({self.a} + {self.b}) * {self.c}. Use the add and multiply tools."

    @property
    def answer(self) -> str:
        return str((self.a + self.b) * self.c)

    def row(self) -> dict[str, Any]:
        """The gym `/run` body: the question as the only input message, the operands and the expected answer."""
        return {
            "responses_create_params": {"input": [{"role": "user", "content": self.question}]},
            "operands": [self.a, self.b, self.c],
            "expected_answer": self.answer,
            "agent_ref": dict(AGENT_REF),
        }


def all_problems(
    max_addend: int = DEFAULT_MAX_ADDEND,
    min_multiplier: int = DEFAULT_MIN_MULTIPLIER,
    max_multiplier: int = DEFAULT_MAX_MULTIPLIER,
) -> list[ChainProblem]:
    """Every (a, b, c) with a, b in 1..max_addend and c in min_multiplier..max_multiplier, in that order."""
    if max_addend < 1 or not 1 <= min_multiplier <= max_multiplier:
        raise ValueError(
            f"need max_addend >= 1 and 1 <= min_multiplier <= max_multiplier, got max_addend={max_addend}, "
            f"min_multiplier={min_multiplier}, max_multiplier={max_multiplier}"
        )
    addends = range(1, max_addend + 1)
    return [ChainProblem(a, b, c) for a in addends for b in addends for c in range(min_multiplier, max_multiplier + 1)]


def make_tool_task_splits(
    num_validation: int,
    seed: int,
    max_addend: int = DEFAULT_MAX_ADDEND,
    min_multiplier: int = DEFAULT_MIN_MULTIPLIER,
    max_multiplier: int = DEFAULT_MAX_MULTIPLIER,
    num_train: int | None = None,
) -> tuple[list[ChainProblem], list[ChainProblem]]:
    """(train, validation) chain problems: see splits.disjoint_splits."""
    problems = all_problems(max_addend, min_multiplier, max_multiplier)
    return disjoint_splits(problems, num_validation, seed, num_train, "")


def tool_output(result: int) -> str:
    """The text a tool answers with, as the gym's tools write it: compact JSON, `{"result":19}`."""
    return json.dumps({"result": result}, separators=(",", ":"))


def tool_call_message(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn that only calls one tool (OpenAI shape; arguments as a JSON string, json.dumps spacing)."""
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def play_messages(problem: ChainProblem, multiply_left: int, final_answer: str) -> list[dict[str, Any]]:
    """The whole conversation of a play that passes `multiply_left` to multiply and answers `final_answer`.

    The tool messages are what the tools answer to these arguments, so a wrong copy stays consistent.
    """
    total, product = problem.a + problem.b, multiply_left * problem.c
    return [
        {"role": "user", "content": problem.question},
        tool_call_message("call_1", "add", {"a": problem.a, "b": problem.b}),
        {"role": "tool", "tool_call_id": "call_1", "content": tool_output(total)},
        tool_call_message("call_2", "multiply", {"a": multiply_left, "b": problem.c}),
        {"role": "tool", "tool_call_id": "call_2", "content": tool_output(product)},
        {"role": "assistant", "content": final_answer},
    ]


def near_miss(value: int, rng: random.Random) -> int:
    """A plausible slip, never `value` and never below 1: off by one, or one digit changed by one."""
    digits = list(str(value))
    if len(digits) == 1 or rng.random() < 0.5:
        return value + 1 if value == 1 or rng.random() < 0.5 else value - 1
    position = rng.randrange(len(digits))
    lowest = 1 if position == 0 else 0  # a leading zero would be a malformed number
    digit = int(digits[position])
    digits[position] = str(rng.choice([d for d in (digit - 1, digit + 1) if lowest <= d <= 9]))
    return int("".join(digits))


@dataclass(frozen=True)
class Demonstration:
    """One supervised conversation (OpenAI-shape messages) and the mistake it contains, if any."""

    messages: list[dict[str, Any]]
    mistake: Mistake

    @property
    def is_correct(self) -> bool:
        return self.mistake == "none"


def demonstrate(problem: ChainProblem, mistake: Mistake, rng: random.Random) -> Demonstration:
    """The play of `problem` with `mistake`: a near-miss final answer, or a near-miss of the sum into multiply."""
    total = problem.a + problem.b
    if mistake == "copy":
        wrong_total = near_miss(total, rng)
        return Demonstration(play_messages(problem, wrong_total, str(wrong_total * problem.c)), mistake)
    if mistake == "answer":
        return Demonstration(play_messages(problem, total, str(near_miss(int(problem.answer), rng))), mistake)
    return Demonstration(play_messages(problem, total, problem.answer), mistake)


def make_demonstrations(
    problems: list[ChainProblem], num_demonstrations: int, wrong_fraction: float, seed: int
) -> list[Demonstration]:
    """`num_demonstrations` plays drawn with replacement; each is wrong with prob wrong_fraction (half per kind).

    The choice is per example, so the warm-up learns p(right step) rather than memorising one mistake per problem.
    """
    if not problems:
        raise ValueError("make_demonstrations needs at least one problem")
    if not 0.0 <= wrong_fraction < 1.0:
        raise ValueError(f"wrong_fraction must be in [0, 1), got {wrong_fraction}")
    rng = random.Random(seed)
    demonstrations = []
    for _ in range(num_demonstrations):
        problem = rng.choice(problems)
        mistake: Mistake = "none"
        if rng.random() < wrong_fraction:
            mistake = "answer" if rng.random() < 0.5 else "copy"
        demonstrations.append(demonstrate(problem, mistake, rng))
    return demonstrations


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class ParsedCall:
    """One tool call read from generated text: the name and the decoded arguments (any JSON value)."""

    name: str
    arguments: Any


def parse_generation(text: str) -> tuple[str, list[ParsedCall]]:
    """(content, calls) of one generated assistant text (EOS removed), the way the policy server reads it.

    A `<tool_call>` block whose body is a JSON object with a string `name` is a call and is cut from the
    content; a malformed block stays in the content. (gym/chat_prompt.py is a layer above, hence this copy.)
    """
    calls: list[ParsedCall] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(ParsedCall(body["name"], body.get("arguments", {})))
    kept.append(text[position:])
    content = "".join(kept)
    return (content.strip() if calls else content), calls


def call_tool(call: ParsedCall) -> str:
    """The tool's answer text: the `tool_output` of add / multiply on integer `a` and `b`, else an error."""
    arguments = call.arguments
    if call.name not in ("add", "multiply"):
        return json.dumps({"error": f"Unknown tool {call.name!r}"})
    if not isinstance(arguments, dict) or not all(_is_int(arguments.get(key)) for key in ("a", "b")):
        return json.dumps({"error": f"{call.name} needs integer arguments a and b, got {arguments!r}"})
    a, b = arguments["a"], arguments["b"]
    return tool_output(a + b if call.name == "add" else a * b)


def is_well_formed_turn(content: str, calls: list[ParsedCall]) -> bool:
    """The turn has the demonstrated shape: one add/multiply call on integers `a` and `b` alone, or a bare number."""
    if not calls:
        return re.fullmatch(r"\d+", content) is not None
    if content or len(calls) != 1 or calls[0].name not in ("add", "multiply"):
        return False
    arguments = calls[0].arguments
    return isinstance(arguments, dict) and set(arguments) == {"a", "b"} and all(_is_int(v) for v in arguments.values())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a number


def last_number(text: str) -> float | None:
    """The last number written in `text` (commas inside numbers ignored), or None; as the gym's verify reads it."""
    numbers = _NUMBER.findall(text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


def reward(final_text: str, expected_answer: str) -> float:
    """1.0 iff the last number of the final assistant message equals the expected answer."""
    extracted = last_number(final_text)
    return 1.0 if extracted is not None and extracted == last_number(expected_answer) else 0.0
