"""A custom reward for asyncppo (README, "Custom rewards"): full credit for exactly the answer, half credit when
the answer is one of the numbers in a longer response, nothing otherwise.

`custom_reward.yaml` beside this file names it as `env.reward_function: contains_answer:reward`; the config's
directory is on the import path, so no PYTHONPATH is needed.
"""

import re

NUMBER = re.compile(r"-?\d+")


def reward(response_text: str, row: dict) -> float:
    """`response_text`: the generated text, prompt excluded; `row`: the whole data row (here `answer` is used).

    Pure and stateless, so safe to call from the collector's threads of an async run.
    """
    answer = str(row["answer"]).strip()
    if response_text.strip() == answer:
        return 1.0
    return 0.5 if answer in NUMBER.findall(response_text) else 0.0
