"""Open Inference Protocol request parsing: a body pydantic calls invalid JSON is answered naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.runtime.model import ProtocolError
from app.transports.oip.routes import RepositoryIndexRequest
from app.transports.oip.tensors import invalid_request, parse_request


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            rb'{"inputs": [{"name": "a", "shape": [1], "datatype": "BYTES", "data": ["x\ud800"]}]}',
            "invalid inference request: inputs.0.data.0: must be valid Unicode text (it holds a lone UTF-16 surrogate)",
        ),
        (rb'{"inputs": [], "\udc00": 1}', "invalid inference request: body: field names must be valid Unicode text"),
        (b'{"inputs": [', "invalid inference request: body: Invalid JSON: EOF while parsing a list"),
    ],
)
def test_a_body_that_is_not_json_names_the_field_as_rest_does(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as raised:
        parse_request(body)
    assert str(raised.value).startswith(message)


def test_a_field_name_is_shown_escaped() -> None:
    with pytest.raises(ValidationError) as raised:
        RepositoryIndexRequest.model_validate_json(b'{"\xe2\x80\xaex\\u0000": 1}')
    message = str(invalid_request(raised.value, "repository index request"))
    assert message == "invalid repository index request: \\u202ex\\x00: Extra inputs are not permitted"
