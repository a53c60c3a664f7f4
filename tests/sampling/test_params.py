import math

import pytest

from saguaro.sampling import SamplingParams


def test_defaults_are_valid_and_normalised():
    sp = SamplingParams()
    assert sp.stop == [] and sp.stop_token_ids == []
    assert not sp.greedy
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=0.0, top_k=-1, top_p=1, seed=0).greedy


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "1.0"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("top_p", math.nan),
        ("top_k", -2),
        ("top_k", 2.5),
        ("top_k", True),
        ("max_tokens", 0),
        ("max_tokens", 3.0),
        ("seed", 1.5),
        ("seed", "42"),
        ("seed", -(2**63) - 1),
        ("seed", 2**64),
        ("stop", ""),
        ("stop", ["ok", ""]),
        ("stop", [3]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [1.0]),
    ],
)
def test_invalid_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field) as err:
        SamplingParams(**{field: value})
    assert repr(value if not isinstance(value, list) else value[-1]) in str(err.value)


def test_stop_normalisation():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=["a", "bc"]).stop == ["a", "bc"]
    assert SamplingParams(stop=("a",)).stop == ["a"]
    assert SamplingParams(stop_token_ids=[2, 0]).stop_token_ids == [2, 0]
    assert SamplingParams(stop_token_ids=(7,)).stop_token_ids == [7]


def test_normalisation_copies_the_callers_list():
    ids = [5]
    sp = SamplingParams(stop_token_ids=ids)
    sp.stop_token_ids.append(6)
    assert ids == [5]
