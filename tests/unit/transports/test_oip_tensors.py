"""Open Inference Protocol requests: errors name the field as REST does, and show client text escaped."""

from __future__ import annotations

import re

import pytest

from app.runtime.model import ProtocolError, TensorSpec
from app.transports.oip.inference import check_parameters
from app.transports.oip.routes import RepositoryIndexRequest
from app.transports.oip.tensors import decode_inputs, parse_request


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
    with pytest.raises(ProtocolError) as raised:
        parse_request(b'{"\xe2\x80\xaex\\u0000": 1}', RepositoryIndexRequest, "repository index request")
    message = str(raised.value)
    assert message == "invalid repository index request: \\u202ex\\x00: Extra inputs are not permitted"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"\xe2\x80\xaep": 1}', "parameters.\\u202ep: not a parameter"),
        (b'{"timeout": "\xe2\x80\xae"}', 'parameters.timeout is "\\u202e"; it must be'),
    ],
)
def test_parameter_names_and_values_are_shown_escaped(body: bytes, message: str) -> None:
    request = parse_request(
        b'{"inputs": [{"name": "q", "shape": [1], "datatype": "BYTES", "data": ["a"]}], "parameters": ' + body + b"}"
    )
    with pytest.raises(ProtocolError, match=re.escape(message)):
        check_parameters(request)


def test_a_datatype_is_shown_escaped() -> None:
    request = parse_request(b'{"inputs": [{"name": "q", "shape": [1], "datatype": "\xe2\x80\xaeFP32", "data": [1]}]}')
    with pytest.raises(ProtocolError, match=re.escape("input q has datatype \\u202eFP32; the model expects FP32")):
        decode_inputs(request, b"", [TensorSpec("q", "FP32", (-1,))])


def test_bytes_data_that_is_not_text_names_the_element() -> None:
    request = parse_request(b'{"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", 5]}]}')
    with pytest.raises(ProtocolError, match=re.escape("input s: element 1 is 5; BYTES data must be JSON strings")):
        decode_inputs(request, b"", [TensorSpec("s", "BYTES", (-1,))])


def test_bytes_binary_data_of_the_wrong_count_says_it_is_the_binary_data() -> None:
    request = parse_request(
        b'{"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 10}}]}'
    )
    with pytest.raises(ProtocolError, match=re.escape("input s: shape [1] needs 1 elements, the binary data has 2")):
        decode_inputs(request, b"\x01\x00\x00\x00a\x01\x00\x00\x00b", [TensorSpec("s", "BYTES", (-1,))])
