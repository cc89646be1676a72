"""json_reader: a JSON document from outside read within the daemon's memory bound."""
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lich_control.json_reader import MAX_VALUES, TooMany, count_values, loads


# -- loads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_a_document_is_read_in_any_encoding_json_loads_detects(encoding):
    doc = [{"id": "m1", "kind": "prompt", "text": "é ✓ 𝄞"}]
    assert loads(json.dumps(doc, ensure_ascii=False).encode(encoding)) == doc


def test_an_integer_past_4300_digits_reads_as_infinity_not_a_refusal_of_the_document():
    # Python before 3.9.14 has no digit limit: there it is read as it is.
    big = float("inf") if hasattr(sys, "get_int_max_str_digits") else int("9" * 5000)
    assert loads(b'[{"id": "m1", "n": ' + b"9" * 5000 + b'}, {"id": "m2", "n": -' + b"9" * 5000 + b"}]") == [
        {"id": "m1", "n": big},
        {"id": "m2", "n": -big},
    ]


def test_a_document_of_more_values_than_the_bound_is_refused_before_it_is_built():
    with pytest.raises(TooMany, match=f"^the body holds more than {MAX_VALUES:,} JSON values$"):
        loads(b"[" + b",".join([b"{}"] * MAX_VALUES) + b"]")
    assert len(loads(b"[" + b",".join([b"1"] * (MAX_VALUES - 2)) + b"]")) == MAX_VALUES - 2  # the bound itself is read


def test_brackets_and_commas_inside_strings_are_no_values():
    text = '[,]{"\\"' * 50_000
    assert loads(json.dumps([{"id": "m1", "text": text}]).encode()) == [{"id": "m1", "text": text}]


@pytest.mark.parametrize("body", [b"[", b'["\\"\\"\\"', b'["x\\', b"\xff[]", b"[] []", b""])
def test_what_is_not_one_json_document_is_a_value_error(body):
    with pytest.raises(ValueError):
        loads(body)


def values_in(value):
    """The values a document of `value` counts: each array or object its two
    brackets and a comma between each two members."""
    if isinstance(value, (list, dict)):
        members = list(value.values()) if isinstance(value, dict) else value
        return 2 + max(len(members) - 1, 0) + sum(map(values_in, members))
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{},"\\:aé\n\ud800', max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{},"\\a', max_size=4), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_the_count_of_values_sees_only_what_is_outside_strings(value, ascii_only, indent):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert count_values(text) == values_in(value)
    assert loads(text.encode("utf-8", "surrogatepass")) == value
