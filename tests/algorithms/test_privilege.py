"""Privileged critic, pure parts: task field lookup and rendering, the token budget, the block, metrics, layouts.

The budget tests count one token per character (count = len, truncate = slice), so every number is a length:
TRUNCATION_MARKER "\\n... [truncated]" is 16 characters.
"""

import pytest
import torch

from asyncppo.algorithms.privilege import (
    OMISSION_MARKER,
    TRUNCATION_MARKER,
    field_text,
    fit_to_budget,
    insert_into_rows,
    prepend_prefixes,
    privilege_metrics,
    read_task_field,
    remap_between_masks,
    render_reference_block,
)
from asyncppo.config.models import PrivilegedCriticConfig, PrivilegedFieldConfig

MARKER = len(TRUNCATION_MARKER)


def count_chars(text: str) -> int:
    return len(text)


def cut_chars(text: str, n: int) -> str:
    return text[:n]


def field(name: str, max_tokens: int | None = None) -> PrivilegedFieldConfig:
    return PrivilegedFieldConfig(name=name, title=name, max_tokens=max_tokens)


def render(task: dict[str, object], fields: list[PrivilegedFieldConfig], budget: int):
    settings = PrivilegedCriticConfig(enabled=True, fields=fields, max_total_tokens=budget)
    return render_reference_block(task, settings, count_chars, cut_chars)


def test_marker_length_the_budget_tests_assume():
    assert MARKER == 16


# --- task fields -------------------------------------------------------------------------------------------------


def test_dotted_paths_walk_nested_dicts_and_missing_keys_give_none():
    task = {"answer": "25", "meta": {"gold": {"patch": "diff"}}, "a.b": "literal", "flat": "x"}
    assert read_task_field(task, "answer") == "25"
    assert read_task_field(task, "meta.gold.patch") == "diff"
    assert read_task_field(task, "a.b") == "literal"  # a key with a dot wins over the walk
    assert read_task_field(task, "meta.silver") is None
    assert read_task_field(task, "flat.deeper") is None  # a string has no keys
    assert read_task_field(task, "nothing") is None


def test_lists_render_one_item_per_line_and_dicts_as_sorted_json():
    assert field_text(["test_a", "test_b", 3, {"k": 1}]) == 'test_a\ntest_b\n3\n{"k": 1}'
    assert field_text({"b": 2, "a": [1, "x"]}) == '{"a": [1, "x"], "b": 2}'
    assert field_text("verbatim  text\n") == "verbatim  text\n"
    assert field_text(7) == "7" and field_text(True) == "true"


@pytest.mark.parametrize("empty", [None, "", "  \n", [], {}, [""]])
def test_values_without_content_render_as_none(empty: object):
    assert field_text(empty) is None


# --- budget ------------------------------------------------------------------------------------------------------


def test_untruncated_block_is_exact_and_has_no_markers():
    block = render({"answer": "25", "tests": ["t1", "t2"]}, [field("answer"), field("tests")], budget=100)
    assert block is not None
    assert block.text == "<reference>\n<answer>\n25\n</answer>\n<tests>\nt1\nt2\n</tests>\n</reference>"
    assert not block.truncated and block.dropped_tokens == 0
    assert "[truncated]" not in block.text and "[omitted" not in block.text


def test_truncated_field_ends_with_the_marker_and_the_marker_is_charged():
    text = "x" * 50
    (outcome,) = fit_to_budget([(field("a"), text)], 30, count_chars, cut_chars)
    # limit 30 = 14 characters of text + the 16-character marker.
    assert outcome.status == "truncated"
    assert outcome.text == "x" * 14 + TRUNCATION_MARKER
    assert (outcome.wanted_tokens, outcome.kept_tokens) == (50, 14)
    assert count_chars(outcome.text) == 30


def test_budget_is_spent_in_priority_order():
    first, second = field("first"), field("second")
    texts = {"first": "a" * 40, "second": "b" * 40}
    # 50 tokens: the first field takes 40; 10 left < marker + 1, so the second is omitted.
    forward = fit_to_budget([(first, texts["first"]), (second, texts["second"])], 50, count_chars, cut_chars)
    assert [o.status for o in forward] == ["whole", "omitted"]
    backward = fit_to_budget([(second, texts["second"]), (first, texts["first"])], 50, count_chars, cut_chars)
    assert [(o.field.name, o.status) for o in backward] == [("second", "whole"), ("first", "omitted")]


def test_starved_field_becomes_the_omission_marker():
    block = render({"a": "a" * 20, "b": "bbb"}, [field("a"), field("b")], budget=20)
    assert block is not None
    assert block.text == f"<reference>\n<a>\n{'a' * 20}\n</a>\n<b>\n{OMISSION_MARKER}\n</b>\n</reference>"
    assert block.truncated and block.dropped_tokens == 3


def test_per_field_cap_binds_before_the_total_and_leaves_the_rest_to_later_fields():
    texts = [(field("a", max_tokens=20), "a" * 30), (field("b"), "b" * 60)]
    outcomes = fit_to_budget(texts, 100, count_chars, cut_chars)
    # a: cap 20 = 4 characters + marker; b: 100 - 20 = 80 >= 60, whole.
    assert [(o.status, o.kept_tokens) for o in outcomes] == [("truncated", 4), ("whole", 60)]


def test_a_cap_below_the_marker_omits_the_field():
    (outcome,) = fit_to_budget([(field("a", max_tokens=MARKER), "a" * 30)], 100, count_chars, cut_chars)
    assert outcome.status == "omitted" and outcome.text == OMISSION_MARKER


def test_a_truncate_that_overshoots_is_shrunk_until_the_text_fits():
    def sloppy(text: str, n: int) -> str:
        return text[: n + 3]  # re-encoding a cut text can give more tokens than asked for

    (outcome,) = fit_to_budget([(field("a"), "a" * 50)], 30, count_chars, sloppy)
    assert outcome.kept_tokens <= 14 and count_chars(outcome.text) <= 30


def test_rendering_is_deterministic_and_ignores_dict_order():
    fields = [field("meta"), field("answer")]
    one = render({"answer": "x" * 40, "meta": {"b": 1, "a": 2}}, fields, budget=30)
    two = render({"meta": {"a": 2, "b": 1}, "answer": "x" * 40}, fields, budget=30)
    assert one is not None and two is not None and one.text == two.text


def test_absent_fields_are_left_out_and_a_task_without_any_has_no_block():
    block = render({"answer": "7"}, [field("gold"), field("answer")], budget=100)
    assert block is not None and block.text == "<reference>\n<answer>\n7\n</answer>\n</reference>"
    assert render({"other": 1}, [field("gold"), field("answer")], budget=100) is None


def test_privilege_metrics_are_row_averages_over_rows_with_a_block():
    fields = [field("a"), field("b")]
    whole = render({"a": "aa", "b": "bb"}, fields, budget=100)
    cut = render({"a": "a" * 40, "b": "bb"}, fields, budget=30)  # a truncated (14 kept of 40), b omitted
    assert whole is not None and cut is not None
    metrics = privilege_metrics([whole, cut, None], [10, 20, 0], fields)
    assert metrics == {
        "privilege/n_rows_without_privilege": 1.0,
        "privilege/frac_truncated": 0.5,
        "privilege/block_tokens_mean": 15.0,
        "privilege/block_tokens_max": 20.0,
        "privilege/dropped_tokens_mean": (0 + (40 - 14) + 2) / 2,
        "privilege/frac_truncated_a": 0.5,
        "privilege/frac_truncated_b": 0.5,
    }
    assert privilege_metrics([None], [0], fields) == {"privilege/n_rows_without_privilege": 1.0}


# --- layouts -----------------------------------------------------------------------------------------------------


def test_remap_moves_values_in_order_and_zeros_everything_else():
    source = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]])
    source_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    target_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    moved = remap_between_masks(source, source_mask, target_mask)
    assert torch.equal(moved, torch.tensor([[0.0, 0.0, 1.0, 2.0, 3.0], [0.0, 4.0, 5.0, 0.0, 0.0]]))


def test_remap_there_and_back_restores_the_masked_positions():
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(3, 6, generator=generator)
    source_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1]], dtype=torch.bool)
    target_mask = torch.tensor(
        [[0, 0, 0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0]], dtype=torch.bool
    )
    there = remap_between_masks(source, source_mask, target_mask)
    back = remap_between_masks(there, target_mask, source_mask)
    assert torch.equal(back, source * source_mask)


def test_remap_rejects_rows_with_different_counts():
    source_mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    with pytest.raises(ValueError, match="row 1: source_mask sets 2 positions but target_mask sets 3"):
        remap_between_masks(torch.ones(2, 3), source_mask, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]))
    with pytest.raises(ValueError, match="row 0: source_mask sets 2 positions but target_mask sets 1"):
        remap_between_masks(torch.ones(2, 3), source_mask, torch.tensor([[0, 1], [1, 1]]))


def test_prepend_prefixes_puts_each_prefix_before_its_verbatim_row():
    input_ids = torch.tensor([[11, 12, 13], [21, 22, 0]])
    attention = torch.tensor([[1, 1, 1], [1, 1, 0]])
    layout = prepend_prefixes(input_ids, attention, [[7, 8], []], pad_token_id=0)
    assert torch.equal(layout.input_ids, torch.tensor([[7, 8, 11, 12, 13], [21, 22, 0, 0, 0]]))
    assert torch.equal(layout.attention_mask, torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]))
    assert torch.equal(layout.prefix_lengths, torch.tensor([2, 0]))
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [0.6, 0.7, 0.0, 0.0, 0.0]])
    assert torch.equal(layout.to_policy(values), torch.tensor([[0.3, 0.4, 0.5], [0.6, 0.7, 0.0]]))
    assert torch.equal(layout.to_critic(input_ids.float()), torch.tensor([[0, 0, 11, 12, 13], [21, 22, 0, 0, 0.0]]))


def test_prepend_prefixes_needs_right_padding_and_one_prefix_per_row():
    with pytest.raises(ValueError, match="right padding"):
        prepend_prefixes(torch.tensor([[0, 5]]), torch.tensor([[0, 1]]), [[1]], pad_token_id=0)
    with pytest.raises(ValueError, match="1 insertions for a batch of 2 rows"):
        prepend_prefixes(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2), [[1]], pad_token_id=0)


def test_insert_into_rows_splices_each_insertion_before_its_position():
    # Row 0: [11, 12, 13] with [7, 8] before position 1 -> [11, 7, 8, 12, 13]; row 1: [21, 22] with [9] at its end.
    input_ids = torch.tensor([[11, 12, 13], [21, 22, 0]])
    attention = torch.tensor([[1, 1, 1], [1, 1, 0]])
    layout = insert_into_rows(input_ids, attention, [1, 2], [[7, 8], [9]], pad_token_id=0)
    assert layout.input_ids.tolist() == [[11, 7, 8, 12, 13], [21, 22, 9, 0, 0]]
    assert layout.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert layout.prefix_lengths.tolist() == [2, 1] and layout.insert_positions.tolist() == [1, 2]
    # Policy tokens move past the insertion; inserted positions read 0 and are dropped on the way back.
    assert layout.to_critic(input_ids.float()).tolist() == [[11, 0, 0, 12, 13], [21, 22, 0, 0, 0]]
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [0.6, 0.7, 0.8, 0.0, 0.0]])
    assert torch.equal(layout.to_policy(values), torch.tensor([[0.1, 0.4, 0.5], [0.6, 0.7, 0.0]]))


def test_insert_into_rows_refuses_a_position_outside_the_row():
    with pytest.raises(ValueError, match=r"row 1: insert position 3 is outside 0\.\.2"):
        insert_into_rows(torch.tensor([[1, 2], [3, 4]]), torch.ones(2, 2), [0, 3], [[5], [6]], pad_token_id=0)
