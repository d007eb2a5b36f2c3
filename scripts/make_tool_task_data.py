"""Writes the multi-step tool demo's gym rows: examples/data/multi_step/{train,validation}.jsonl.

Each row is a NeMo-Gym `/run` body for "Compute (a + b) * c" (demo/tool_task.py). Deterministic: rerunning it
reproduces the shipped files byte for byte (a test checks). The demo policy's warm-up
(`demo/tool_policy.py`) draws from the same train split, so validation problems stay unseen.

    python scripts/make_tool_task_data.py [--output-dir DIR]
"""

import argparse
import json
from pathlib import Path

from asyncppo.demo.tool_task import DEMO_NUM_VALIDATION, DEMO_SPLIT_SEED, make_tool_task_splits

DEFAULT_OUTPUT_DIR = Path(__file__).resolve().parents[1] / "examples" / "data" / "multi_step"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    # Fixed key order, ASCII and "\n" line ends, so the bytes do not depend on the platform.
    with path.open("w", encoding="ascii", newline="\n") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=True) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR)
    args = parser.parse_args(argv)
    train, validation = make_tool_task_splits(DEMO_NUM_VALIDATION, DEMO_SPLIT_SEED)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.output_dir / "train.jsonl", [problem.row() for problem in train])
    write_jsonl(args.output_dir / "validation.jsonl", [problem.row() for problem in validation])
    print(f"wrote {len(train)} train and {len(validation)} validation rows to {args.output_dir}")


if __name__ == "__main__":
    main()
