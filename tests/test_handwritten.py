"""The hand-written held-out prompts stay out of every training source."""
import json
from pathlib import Path

import pytest

import specdec_lab as sl
from specdec_lab.train.data import generate_data
from specdec_lab.train.handwritten import (HANDWRITTEN, HANDWRITTEN_PROMPTS, NearDuplicateIndex, drop_held_out,
                                           is_held_out_text)
from specdec_lab.train.prompts import BENCH_PROMPTS, chat_prompts, distill_prompts, task_prompts

PROMPT_SETS = Path(sl.__file__).parent / "train" / "prompt_sets"


def training_sources():
    """Every prompt a training run reads: the three template sets and the synthesized files."""
    sources = {"distill": distill_prompts(), "task": task_prompts(), "chat": chat_prompts()}
    for path in sorted(PROMPT_SETS.glob("*.json")):
        sources[path.name] = json.loads(path.read_text())["prompts"]
    return sources


def test_the_set_is_large_distinct_and_spans_many_styles():
    assert len(HANDWRITTEN_PROMPTS) >= 60
    index = NearDuplicateIndex()
    for p in HANDWRITTEN_PROMPTS:
        assert index.match(p) is None, f"two held-out prompts nearly repeat each other: {p!r}"
        index.add(p)
    assert len({kind for kind, _ in HANDWRITTEN}) >= 10


def test_no_held_out_prompt_is_in_any_training_source_even_nearly():
    for name, prompts in training_sources().items():
        leaked = [p for p in prompts if is_held_out_text(p)]
        assert not leaked, f"{name} holds held-out prompts: {leaked[:3]}"
    assert not [p for p in BENCH_PROMPTS if is_held_out_text(p)], "the two evaluation sets must stay apart"


def test_near_duplicates_of_held_out_prompts_are_caught():
    assert is_held_out_text(HANDWRITTEN_PROMPTS[0].upper())
    edited = HANDWRITTEN_PROMPTS[13].replace("landlord", "neighbour")  # one word changed
    assert is_held_out_text(edited)
    assert not is_held_out_text("Draft an email to my dentist to move my appointment to Tuesday.")
    assert drop_held_out(["Why do cats purr?", HANDWRITTEN_PROMPTS[5]]) == ["Why do cats purr?"]


def test_the_data_command_refuses_held_out_prompts(tmp_path):
    target = sl.tiny_model(0)
    with pytest.raises(ValueError, match="held-out"):
        generate_data(target, None, tmp_path, rounds=(0.0,), prompts=[[1, 2, 3], HANDWRITTEN_PROMPTS[20]],
                      progress=False)
    assert not list(tmp_path.glob("round*.pt")), "nothing may be written before the refusal"
