"""A corpus of hostile requests against a real `python -m app` on the committed models.

Each request must get a 4xx (never a 5xx, never a dropped connection without an answer where HTTP
allows one), and the server must still answer /health right after it. Raw sockets send what an HTTP
client library would refuse to build.
"""

from __future__ import annotations

import gzip
import json
import re
import select
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import COMMITTED
from tests.helpers import Server, running_server

pytestmark = pytest.mark.slow  # each test starts a server, a browser or a training run: seconds (-m "not slow")

PAIR = {"sentence_a": "A man is playing a guitar.", "sentence_b": "A person plays an instrument."}
HISTORY = {"interactions": [{"question": 1, "correct": True}]}
KT_INFER, SIM_INFER = "/v2/models/dkvmn-assist2009/infer", "/v2/models/rmc-vlmp-sick/infer"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(COMMITTED, MNEMO_BODY_TIMEOUT_S="2") as live:
        yield live
    errors = [line[:300] for line in live.output if '"level": "error"' in line]
    assert not errors, errors


def raw(server: Server, request: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes (stopping early if the server answers first) and return the server's first response."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sent = 0
        while sent < len(request) and not select.select([sock], [], [], 0)[0]:
            try:
                sent += sock.send(request[sent : sent + 65536])
            except (BrokenPipeError, ConnectionResetError):
                break
        return read_response(sock)


def read_response(sock: socket.socket) -> bytes:
    """One HTTP response: the head, then Content-Length bytes (or everything until the server closes)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        while (length is None or len(body) < int(length.group(1))) and (chunk := sock.recv(65536)):
            body += chunk
        return head + b"\r\n\r\n" + body
    except (TimeoutError, ConnectionResetError):
        return data


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def post_raw_json(server: Server, path: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    return raw(server, head.encode() + b"Connection: close\r\n\r\n" + body)


def assert_alive(server: Server) -> None:
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def sim(**fields) -> bytes:
    return json.dumps({**PAIR, **fields}).encode()


def infer(*inputs: dict) -> bytes:
    """An Open Inference Protocol request body with these input tensors."""
    return json.dumps({"inputs": list(inputs)}).encode()


NON_FINITE_AND_UNICODE = [
    # (path, raw JSON body, the field the 422 must name)
    ("/similarity", b'{"sentence_a": NaN, "sentence_b": "x"}', ["body", "sentence_a"]),
    ("/similarity", b'{"sentence_a": "a", "sentence_b": Infinity}', ["body", "sentence_b"]),
    ("/similarity", b'{"sentence_a": "a b", "sentence_b": -Infinity}', ["body", "sentence_b"]),
    ("/similarity", b'{"sentence_a": 1e400, "sentence_b": "x"}', ["body", "sentence_a"]),
    ("/similarity", b'{"sentence_a": "a", "sentence_b": "b", "return_attention": NaN}', ["body", "return_attention"]),
    ("/similarity", b'{"sentence_a": "\\ud800", "sentence_b": "x"}', ["body", "sentence_a"]),
    ("/similarity", b'{"sentence_a": "a", "sentence_b": "b \\udfff c"}', ["body", "sentence_b"]),
    ("/similarity", b'{"sentence_a": "a", "sentence_b": "b", "model": "\\ud83d"}', ["body", "model"]),
    ("/similarity/batch", b'{"pairs": [{"sentence_a": "a", "sentence_b": "\\ud800"}]}', ["body", "pairs", 0]),
    ("/embeddings", b'{"sentences": ["a", "b \\udfff c"]}', ["body", "sentences", 1]),
    ("/embeddings", b'{"sentences": [NaN]}', ["body", "sentences", 0]),
    ("/similarity/from-embeddings", b'{"embedding_a": [NaN], "embedding_b": [1.0]}', ["body", "embedding_a", 0]),
    ("/similarity/from-embeddings", b'{"embedding_a": [1.0], "embedding_b": [1e400]}', ["body", "embedding_b", 0]),
    ("/similarity/from-embeddings", b'{"embedding_a": [-Infinity], "embedding_b": [1]}', ["body", "embedding_a", 0]),
    ("/knowledge-trace", b'{"interactions": [{"question": NaN, "correct": true}]}', ["body", "interactions", 0]),
    ("/knowledge-trace", b'{"interactions": [{"question": 1e400, "correct": true}]}', ["body", "interactions", 0]),
    ("/knowledge-trace", b'{"interactions": [{"question": -1e400, "correct": true}]}', ["body", "interactions", 0]),
    ("/knowledge-trace", b'{"interactions": [{"question": 1, "correct": Infinity}]}', ["body", "interactions", 0]),
    (
        "/knowledge-trace",
        b'{"interactions": [{"question": 1, "correct": true}], "next_questions": [NaN]}',
        ["body", "next_questions", 0],
    ),
    (
        "/knowledge-trace",
        b'{"interactions": [{"question": 1e309, "correct": true}], "model": "\\ud800"}',
        ["body", "interactions", 0],
    ),
]


@pytest.mark.parametrize(("path", "body", "location"), NON_FINITE_AND_UNICODE)
def test_non_finite_numbers_and_lone_surrogates_are_422_naming_the_field(server, path, body, location):
    response = httpx.post(f"{server.url}{path}", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    locations = [error["loc"] for error in response.json()["detail"]]
    assert any(loc[: len(location)] == location for loc in locations), locations
    assert_alive(server)


BODIES = [
    ("/similarity", b"{not json"),
    ("/similarity", b'{"sentence_a": "a", "sentence_b": "b"'),  # truncated
    ("/similarity", b"\xff\xfe\x00{"),  # not UTF-8
    ("/similarity", b'{"sentence_a": "\xed\xa0\x80", "sentence_b": "b"}'),  # a surrogate encoded as raw UTF-8
    ("/similarity", b'{"sentence_a": "a\x00b", "sentence_b": "c"}'),  # raw control character in a string
    ("/similarity", sim(sentence_a="a\u0000\u0007\u001b[31m b")),  # escaped control characters
    ("/similarity", sim(sentence_a="!!!", sentence_b="...")),  # no word tokens
    ("/similarity", sim(sentence_a=" \t\n ")),
    ("/similarity", sim(sentence_a="\u200b\ufeff \u200f\u200e")),  # invisible format characters only
    ("/embeddings", json.dumps({"sentences": ["\u2060"]}).encode()),
    ("/similarity", sim(sentence_a="word " * 300)),  # over the token limit
    ("/similarity", sim(sentence_a="x" * 1001)),  # over the character limit
    ("/similarity", sim(sentence_a=["a"])),
    ("/similarity", sim(sentence_a={"$ne": 1})),
    ("/similarity", sim(return_attention="yes")),
    ("/similarity", sim(model="../../etc/passwd")),
    ("/similarity", sim(model="x" * 10_000)),
    ("/similarity", sim(extra_field=1)),
    ("/similarity", b"[]"),
    ("/similarity", b"null"),
    ("/similarity", b'"text"'),
    ("/similarity", b"1e999999999"),
    ("/similarity", b""),
    ("/similarity", b"[" * 100_000 + b"]" * 100_000),  # deeply nested
    ("/similarity", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
    ("/similarity", b'{"sentence_a": "' + b"a" * 2_000_000 + b'"}'),  # over MNEMO_MAX_BODY_BYTES
    ("/similarity/batch", json.dumps({"pairs": [PAIR] * 257}).encode()),
    ("/similarity/batch", json.dumps({"pairs": []}).encode()),
    ("/similarity/batch", json.dumps({"pairs": [{"sentence_a": 1}] * 20_000}).encode()),
    ("/embeddings", json.dumps({"sentences": ["a"] * 257}).encode()),
    ("/embeddings", json.dumps({"sentences": []}).encode()),
    ("/embeddings", json.dumps({"sentences": ["word " * 300]}).encode()),
    ("/embeddings", json.dumps({"sentences": [{"$ne": 1}]}).encode()),
    ("/embeddings", json.dumps({"sentences": ["a"], "model": "dkvmn-assist2009"}).encode()),  # wrong task
    ("/similarity/from-embeddings", json.dumps({"embedding_a": [0.1] * 3, "embedding_b": [0.1] * 512}).encode()),
    ("/similarity/from-embeddings", json.dumps({"embedding_a": [0.1] * 512, "embedding_b": [1e300] * 512}).encode()),
    ("/similarity/from-embeddings", json.dumps({"embedding_a": [[0.1]] * 512, "embedding_b": [0.1] * 512}).encode()),
    ("/similarity/from-embeddings", json.dumps({"embedding_a": [0.1] * 100_000, "embedding_b": [0.1]}).encode()),
    ("/knowledge-trace", json.dumps({"interactions": [{"question": 2**64, "correct": True}]}).encode()),
    ("/knowledge-trace", json.dumps({"interactions": [{"question": -(2**63), "correct": True}]}).encode()),
    ("/knowledge-trace", json.dumps({"interactions": [{"question": 10**400, "correct": True}]}).encode()),
    ("/knowledge-trace", json.dumps({"interactions": [{"question": 999_999, "correct": True}]}).encode()),
    ("/knowledge-trace", json.dumps({"interactions": [{"question": 1.0, "correct": 1}]}).encode()),
    ("/knowledge-trace", json.dumps({**HISTORY, "next_questions": [0, -5]}).encode()),
    ("/knowledge-trace", json.dumps({**HISTORY, "next_questions": [2**70]}).encode()),
    ("/knowledge-trace", json.dumps({"interactions": [{"question": 1, "correct": True}] * 10_001}).encode()),
    ("/knowledge-trace", json.dumps({**HISTORY, "model": "dkvmn-nope"}).encode()),
    ("/knowledge-trace", json.dumps({**HISTORY, "model": "rmc-vlmp-sick"}).encode()),  # wrong task
    ("/students/learner-h/interactions", b'{"interactions": [{"question": NaN, "correct": true}]}'),
    ("/students/learner-h/interactions", b'{"model": "\\ud800", "interactions": [{"question": 1, "correct": true}]}'),
    (
        "/students/learner-h/interactions",
        json.dumps({"interactions": [{"question": 1, "correct": True}] * 10_001}).encode(),
    ),
    ("/students/a%20b/interactions", json.dumps(HISTORY).encode()),  # a student id with a space
    ("/students/learner-h/interactions", b"[" * 100_000 + b"]" * 100_000),
    (KT_INFER, b'{"inputs": [{"name": "q", "shape": [1, 1], "datatype": "INT64", "data": [1e400]}]}'),
    (
        SIM_INFER,
        b'{"id": "\\ud800", "inputs": [{"name": "sentence_a", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}',
    ),
    (
        KT_INFER,
        infer({"name": "q", "shape": [2**32, 2**32], "datatype": "INT64", "parameters": {"binary_data_size": 0}}),
    ),
    (KT_INFER, infer({"name": "q", "shape": [1, 1], "datatype": "INT64", "data": [1, [2]]})),
    (KT_INFER, b"[" * 100_000 + b"]" * 100_000),
    ("/v2/models/nope/infer", b"{}"),
]


@pytest.mark.parametrize(("path", "body"), BODIES, ids=lambda value: repr(value)[:40])
def test_hostile_bodies_get_a_4xx_and_the_server_lives(server, path, body):
    status = status_of(post_raw_json(server, path, body))
    assert 400 <= status < 500, status
    assert_alive(server)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "json"]
)
def test_wrong_content_types_are_415(server, content_type):
    assert status_of(post_raw_json(server, "/similarity", json.dumps(PAIR).encode(), content_type)) == 415
    assert_alive(server)


@pytest.mark.parametrize("path", ["/similarity", "/knowledge-trace"])
def test_a_wrong_content_type_is_415_before_the_body_is_read(server, path):
    """No body follows the head: a server that read it first would answer the body timeout's 408."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n"
    answer = raw(server, head.encode())
    assert status_of(answer) == 415 and b"application/json" in answer, answer[-300:]
    assert_alive(server)


def test_a_short_v2_json_header_before_binary_data_is_not_taken_for_utf16(server):
    """Binary tensor data (zero bytes) right after a two-byte JSON header: the protocol's 400, not a 415."""
    head = f"POST {SIM_INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
    head += "Inference-Header-Content-Length: 2\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
    answer = raw(server, head.encode() + b"{}" + bytes(8))
    assert status_of(answer) == 400 and b"UTF-16" not in answer, answer[-300:]
    assert_alive(server)


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate, gzip"])
def test_a_compressed_body_is_415_naming_the_coding(server, coding):
    head = f"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: {coding}\r\n"
    body = gzip.compress(json.dumps(PAIR).encode())
    answer = raw(server, head.encode() + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    assert status_of(answer) == 415 and coding.encode() in answer and b"uncompressed" in answer, answer[-300:]
    assert_alive(server)


REQUESTS = [
    b"DELETE /similarity HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PUT /knowledge-trace HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    b"PATCH /models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"OPTIONS /similarity HTTP/1.1\r\nHost: x\r\n\r\n",
    b"BREW /coffee HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /similarity HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /models/ HTTP/1.1\r\nHost: evil.example\r\n\r\n",  # no slash redirect echoing Host
    b"GET /models/%ED%A0%80/questions HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /models/dkvmn-assist2009/questions?offset=NaN HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /models/dkvmn-assist2009/questions?offset=1e400&limit=-Infinity HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /models/dkvmn-assist2009/questions?limit=99999999999999999999999 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /models/dkvmn-assist2009/questions?offset=%ED%A0%80 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /models/" + b"a" * 5000 + b"/questions HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",  # request line over MNEMO_MAX_HEADER_BYTES
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",  # header over the cap
    b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Many: 1\r\n" * 20_000 + b"\r\n",
    b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET\x00/health HTTP/1.1\r\n\r\n",
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Type: \x01\r\nContent-Length: 2\r\n\r\n{}",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on the plain port
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
    b"POST /similarity HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n{}",  # past int()'s digits
]


@pytest.mark.parametrize("request_bytes", REQUESTS, ids=lambda value: repr(value)[:40])
def test_odd_methods_paths_headers_and_framing_get_a_4xx_and_the_server_lives(server, request_bytes):
    answer = raw(server, request_bytes)
    status = status_of(answer)
    assert 400 <= status < 500, answer[:300]
    assert b"evil.example" not in answer
    assert_alive(server)


def test_no_answer_echoes_an_undecodable_value(server):
    """The 422 body is valid UTF-8 JSON and never holds the offending input."""
    secret = "s3cr3t-value-\ud800"
    body = json.dumps({**PAIR, "sentence_a": secret}).encode()
    answer = httpx.post(f"{server.url}/similarity", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422 and "s3cr3t" not in answer.text
    json.loads(answer.content.decode("utf-8"))


KT_TENSOR = {"name": "questions", "shape": [1, 1], "datatype": "INT64", "data": [1]}
JSON_BODIES = [  # (path, a valid UTF-8 JSON body)
    ("/similarity", json.dumps(PAIR).encode()),
    ("/knowledge-trace", json.dumps(HISTORY).encode()),
    ("/students/learner-charset/interactions", json.dumps(HISTORY).encode()),
    (KT_INFER, infer(KT_TENSOR)),
]
NOT_UTF8 = [  # (how the body is re-encoded, the words the 415 must hold)
    (lambda body: b"\xef\xbb\xbf" + body, "byte order mark"),
    (lambda body: body.decode().encode("utf-16"), "byte order mark"),  # BOM + UTF-16LE
    (lambda body: body.decode().encode("utf-16-le"), "UTF-16 or UTF-32"),
    (lambda body: body.decode().encode("utf-16-be"), "UTF-16 or UTF-32"),
    (lambda body: body.decode().encode("utf-32-le"), "UTF-16 or UTF-32"),
    (lambda body: body.decode().encode("utf-32-be"), "UTF-16 or UTF-32"),
]


def error_text(answer: bytes) -> str:
    payload = json.loads(answer.partition(b"\r\n\r\n")[2])
    return payload["error"] if "error" in payload else payload["detail"]  # /v2 answers in its protocol's shape


@pytest.mark.parametrize(("path", "body"), JSON_BODIES, ids=lambda value: repr(value)[:30])
@pytest.mark.parametrize(("encode", "words"), NOT_UTF8)
def test_a_body_not_in_utf8_or_with_a_bom_is_415_saying_so(server, path, body, encode, words):
    answer = post_raw_json(server, path, encode(body))
    assert status_of(answer) == 415, answer[-300:]
    assert words in error_text(answer) and "UTF-8 JSON" in error_text(answer), answer[-300:]


@pytest.mark.parametrize(("path", "body"), JSON_BODIES, ids=lambda value: repr(value)[:30])
@pytest.mark.parametrize("charset", ["latin-1", "ISO-8859-1", "utf-16", '"UTF-32"'])
def test_a_declared_charset_other_than_utf8_is_415(server, path, body, charset):
    answer = post_raw_json(server, path, body, f"application/json; charset={charset}")
    assert status_of(answer) == 415, answer[-300:]
    assert charset.strip('"').lower() in error_text(answer) and "UTF-8 JSON" in error_text(answer)


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "utf8", '"utf-8"'])
def test_utf8_may_be_declared_in_any_spelling(server, charset):
    answer = post_raw_json(server, "/similarity", json.dumps(PAIR).encode(), f"application/json;charset={charset}")
    assert status_of(answer) == 200, answer[-300:]
