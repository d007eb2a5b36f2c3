"""Writes the CPU demo's addition data: examples/data/arithmetic/{train,validation}.jsonl (prompt, answer rows).

Deterministic: rerunning it reproduces the shipped files byte for byte (a test checks). The demo policy's
warm-up (`demo/arithmetic_policy.py`) draws from the same train split, so validation problems stay unseen.

    python scripts/make_arithmetic_data.py [--output-dir DIR]
"""

import argparse
import json
from pathlib import Path

from asyncppo.demo.arithmetic_task import (
    DEFAULT_MAX_OPERAND,
    DEMO_NUM_VALIDATION,
    DEMO_SPLIT_SEED,
    make_arithmetic_splits,
)

DEFAULT_OUTPUT_DIR = Path(__file__).resolve().parents[1] / "examples" / "data" / "arithmetic"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    # Fixed key order, ASCII and "\n" line ends, so the bytes do not depend on the platform.
    with path.open("w", encoding="ascii", newline="\n") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=True) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    args = parser.parse_args(argv)
    train, validation = make_arithmetic_splits(DEMO_NUM_VALIDATION, DEMO_SPLIT_SEED, DEFAULT_MAX_OPERAND)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.output_dir / "train.jsonl", [problem.row() for problem in train])
    write_jsonl(args.output_dir / "validation.jsonl", [problem.row() for problem in validation])
    print(f"wrote {len(train)} train and {len(validation)} validation rows to {args.output_dir}")


if __name__ == "__main__":
    main()
