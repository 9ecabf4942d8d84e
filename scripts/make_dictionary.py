"""Train the zstd dictionary short values are compressed against (`core/compression.py`).

    python scripts/make_dictionary.py OUT.zdict [--samples N]

A frame of a KB or two finds little in itself to refer back to, and pays
for its own entropy tables; against a dictionary trained on what checkpoints
hold (LangChain messages as this library packs them, prose as chats carry
it) it finds its framing and its tables there. The corpus: messages of every
kind (human, AI with metadata and tool calls, tool results), alone, in a
list (a pending write) and in an input's `{"messages": [...]}`, their text
drawn from this repository's own documentation. The benchmarks' texts are
not in it.

A stored frame names its dictionary by ID, so the shipped dictionary never
changes: a new one gets a new ID (`--dict-id`), and the reader keeps the old.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import re

import zstandard
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from langgraph_fenced_sqlite.core.serde import DataOnlySerializer

ROOT = pathlib.Path(__file__).resolve().parent.parent


def corpus_words() -> list[str]:
    """Return the words of the repository's documentation, in order."""
    files = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    text = " ".join(f.read_text() for f in files)
    return re.findall(r"[A-Za-z][A-Za-z'.,;:!?()-]*", text)


def samples(count: int, seed: int = 7) -> list[bytes]:
    """Return `count` packed values of the shapes checkpoints hold."""
    words = corpus_words()
    rng = random.Random(seed)
    serde = DataOnlySerializer()

    def prose(size: int) -> str:
        at = rng.randrange(len(words) - 2 * size)
        out: list[str] = []
        length = -1
        while length < size:
            out.append(words[at])
            length += len(words[at]) + 1
            at += 1
        return " ".join(out)

    def call_id() -> str:
        return f"call_{rng.getrandbits(96):024x}"

    out = []
    for k in range(count):
        text = prose(rng.choice([40, 120, 300, 700, 1200, 2500]))
        kind = k % 5
        message: object
        if kind == 0:
            message = HumanMessage(content=text, id=f"{rng.getrandbits(128):032x}")
        elif kind == 1:
            message = AIMessage(
                content=text,
                id=f"run-{rng.getrandbits(128):032x}-0",
                response_metadata={"model_name": "gpt-4o-2024-08-06", "finish_reason": "stop"},
                usage_metadata={
                    "input_tokens": rng.randrange(99999),
                    "output_tokens": rng.randrange(9999),
                    "total_tokens": rng.randrange(99999),
                },
            )
        elif kind == 2:
            message = AIMessage(
                content="",
                id=f"run-{rng.getrandbits(128):032x}-0",
                tool_calls=[{"name": "search", "args": {"query": prose(30)}, "id": call_id()}],
            )
        elif kind == 3:
            message = ToolMessage(content=text, tool_call_id=call_id(), name="search")
        else:
            message = SystemMessage(content=text)
        shape = k % 3
        value = message if shape == 0 else [message] if shape == 1 else {"messages": [message]}
        out.append(serde.pack(value)[1])
    return out


def main() -> None:
    """Write the dictionary trained on `samples()` to the path given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where to write the dictionary")
    parser.add_argument("--samples", type=int, default=4000, help="values to train on")
    parser.add_argument("--size", type=int, default=16384, help="dictionary bytes")
    parser.add_argument("--dict-id", type=int, default=0x6C676673, help="the ID frames name")
    args = parser.parse_args()
    trained = zstandard.train_dictionary(
        args.size, samples(args.samples), dict_id=args.dict_id, level=3
    )
    pathlib.Path(args.out).write_bytes(trained.as_bytes())
    print(f"{args.out}: {len(trained.as_bytes())} bytes, dictionary ID {trained.dict_id()}")


if __name__ == "__main__":
    main()
