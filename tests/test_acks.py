import json

import pytest

from lich_control.ack import ANSWER_UNITS, MAX_BODY_BYTES, TRUNCATED, Ack, cut_answer


def units(text):
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def ack(answer=None, error=None, ok=True):
    return Ack("s1", "m9", "ask", ok=ok, error=error, answer=answer)


def test_an_ack_carries_exactly_the_contract_fields():
    assert json.loads(Ack("s1", "m2", "abort", ok=True).body()) == {"session_id": "s1", "id": "m2", "kind": "abort", "ok": True}
    failed = json.loads(Ack("s1", "m5", "effort", ok=False, error="unknown effort").body())
    assert failed == {"session_id": "s1", "id": "m5", "kind": "effort", "ok": False, "error": "unknown effort"}


def test_an_answer_of_exactly_16000_units_is_left_whole():
    text = "a" * ANSWER_UNITS
    assert cut_answer(text) == text


def test_an_answer_one_unit_longer_is_cut_and_marked():
    text = "a" * (ANSWER_UNITS + 1)
    assert cut_answer(text) == "a" * ANSWER_UNITS + TRUNCATED


def test_units_are_utf16_units_not_code_points():
    # 8,000 emoji are 16,000 units: whole. One more is over.
    assert cut_answer("😀" * 8000) == "😀" * 8000
    assert cut_answer("😀" * 8001) == "😀" * 8000 + TRUNCATED


def test_a_cut_never_splits_a_surrogate_pair():
    text = "a" + "😀" * 8000  # unit 16,000 is the high half of a pair
    cut = cut_answer(text)
    assert cut == "a" + "😀" * 7999 + TRUNCATED
    assert units(cut[: -len(TRUNCATED)]) == ANSWER_UNITS - 1


@pytest.mark.parametrize(
    "answer",
    [
        "\x01" * 20000,  # each escapes to six bytes in JSON
        '"' * 40000,  # two bytes each
        "\\" * 40000,
        "字" * 40000,  # three bytes each in UTF-8
        "😀" * 20000,
        "\ud800" * 20000,  # lone surrogates, escaped
        ("\x00é字😀\ud83d" * 5000),
    ],
)
def test_the_body_stays_under_64_kib_whatever_the_answer_holds(answer):
    body = ack(answer).body()
    assert len(body) < MAX_BODY_BYTES
    sent = json.loads(body.decode("utf-8"))
    assert sent["answer"].endswith(TRUNCATED)
    assert answer.startswith(sent["answer"][: -len(TRUNCATED)])


def test_a_body_cut_for_size_keeps_as_much_as_fits():
    body = ack("\x01" * 20000).body()
    sent = json.loads(body)
    # One more escaped character (six bytes) would not have fitted.
    assert len(body) + 6 >= MAX_BODY_BYTES
    assert len(sent["answer"]) < ANSWER_UNITS


def test_a_huge_error_is_cut_to_fit_too():
    body = Ack("s1", "m1", "prompt", ok=False, error="\x02" * 100000).body()
    assert len(body) < MAX_BODY_BYTES
    assert json.loads(body)["error"].endswith(TRUNCATED)


def test_lone_surrogates_travel_as_json_escapes_in_valid_utf8():
    body = ack("a\udc80b").body()
    body.decode("utf-8")  # valid UTF-8
    assert b"\\udc80" in body
    assert json.loads(body)["answer"] == "a\udc80b"
