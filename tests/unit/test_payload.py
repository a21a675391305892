"""User payloads: JSON bytes, from plain values and pydantic models."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from runstream.engine import payload


class Order(BaseModel):
    order_id: int
    at: datetime
    items: list[str]


def test_pydantic_models_round_trip_compactly():
    order = Order(order_id=42, at=datetime(2024, 5, 1, 12, 0, tzinfo=UTC), items=["a", "é"])
    data = payload.dumps({"orders": [order]})
    assert (
        data
        == '{"orders":[{"order_id":42,"at":"2024-05-01T12:00:00Z","items":["a","é"]}]}'.encode()
    )
    assert Order.model_validate(payload.loads(data)["orders"][0]) == order


@pytest.mark.parametrize("value", [None, 1, 2.5, "x", [1, "a"], {"a": {"b": [True, None]}}])
def test_plain_values_round_trip(value):
    assert payload.loads(payload.dumps(value)) == value


def test_what_is_not_json_is_an_error():
    with pytest.raises(Exception, match="Unable to serialize"):
        payload.dumps(object())
