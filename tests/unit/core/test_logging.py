"""The service's logs: records reach stderr in order, all of them by exit; the text and JSON formats."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time

from app.core import logging as service_logging
from app.core.logging import JsonFormatter, TextFormatter, configure_logging, write_out_logs


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("mnemo.test", logging.INFO, __file__, 0, message, None, None)


def test_logged_records_reach_stderr_in_order_and_all_of_them_once_written_out(capsys):
    configure_logging("info", "text")
    logger = logging.getLogger("mnemo.test")
    for index in range(500):
        logger.info("line %d", index)
    write_out_logs()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[1] for line in lines if " mnemo.test: " in line] == [f"line {i}" for i in range(500)]


def test_a_queued_record_reaches_stderr_without_being_written_out(capsys):
    configure_logging("info", "text")
    logging.getLogger("mnemo.test").info("queued, not written out")
    written: list[str] = []
    deadline = time.monotonic() + 10
    while not written and time.monotonic() < deadline:  # the listener's thread writes it
        written = [line for line in capsys.readouterr().err.splitlines() if line.endswith("queued, not written out")]
        time.sleep(0.01)
    assert len(written) == 1


def test_a_traceback_is_formatted_by_the_listener_into_its_own_json_field(capsys):
    configure_logging("info", "json")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("mnemo.test").exception("failed %s", "here")
    write_out_logs()
    (line,) = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"mnemo.test"' in line]
    assert line["message"] == "failed here" and line["exception"].endswith("ValueError: boom")


def test_a_process_writes_out_every_queued_line_when_it_exits():
    program = (
        "import logging\n"
        "from app.core.logging import configure_logging\n"
        "configure_logging('info', 'json')\n"
        "for index in range(2000):\n"
        "    logging.getLogger('mnemo.test').info('line %d', index, extra={'request_id': str(index)})\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["message"] for line in lines] == [f"line {index}" for index in range(2000)]
    assert lines[7]["request_id"] == "7" and lines[7]["logger"] == "mnemo.test" and lines[7]["level"] == "info"


def test_a_forked_child_writes_its_own_records_and_none_of_its_parents():
    """gunicorn --preload forks workers after the app logged: the child's listener thread is gone with the fork."""
    program = (
        "import logging, os\n"
        "from app.core.logging import configure_logging, write_out_logs\n"
        "configure_logging('info', 'text')\n"
        "log = logging.getLogger('mnemo.test')\n"
        "log.info('parent, before the fork')\n"
        "if (child := os.fork()) == 0:\n"
        "    log.info('child')\n"
        "    write_out_logs()\n"
        "    os._exit(0)\n"
        "os.waitpid(child, 0)\n"
        "log.info('parent, after the fork')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    lines = sorted(line.split(": ", 1)[1] for line in done.stderr.splitlines() if " mnemo.test: " in line)
    assert lines == ["child", "parent, after the fork", "parent, before the fork"]


def test_other_loggers_formats_keep_their_fields_once_the_service_configured_logging():
    """gunicorn's and uvicorn's lines under `gunicorn -k uvicorn_worker.UvicornWorker app.main:app` print
    %(process)d: the service had turned off collecting it, and each of their lines was a logging error."""
    configure_logging("info", "text")
    shown = logging.Formatter("[%(process)d] %(threadName)s %(message)s").format(_record("booting"))
    assert shown == f"[{os.getpid()}] {threading.current_thread().name} booting"


def test_the_json_format_has_the_documented_fields_one_line_and_no_raw_control_character():
    try:
        raise ValueError("student abc\n\x1b[2J")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("mnemo.errors", logging.ERROR, __file__, 0, "bug on %s", ("/x\r\n\u2028",), exc_info)
    record.request_id, record.color_message = "req-1", "\x1b[31mbug\x1b[0m"  # extra fields; uvicorn's colour copy
    line = JsonFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "\u2028" not in line, line
    fields = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields.pop("time")), line
    assert fields.pop("exception").startswith("Traceback (most recent call last):")
    assert fields == {
        "level": "error",
        "logger": "mnemo.errors",
        "message": "bug on /x\r\n\u2028",
        "request_id": "req-1",
    }


def test_the_text_format_escapes_control_characters_in_a_message_so_it_stays_one_line():
    message = "model said: bad\r\n2026-01-01 00:00:00,000 INFO mnemo.access: GET / 200\x1b[2J\x00\u2028\x85\u202e é"
    line = TextFormatter().format(_record(message))
    assert line.endswith(
        " INFO mnemo.test: model said: bad\\r\\n2026-01-01 00:00:00,000 INFO mnemo.access: GET / 200"
        "\\x1b[2J\\x00\\u2028\\x85\\u202e é"  # a bidi override too: it could reorder what the terminal shows
    ), line


def test_a_traceback_in_the_text_format_is_indented_so_its_message_cannot_start_a_line():
    try:
        raise ValueError("student abc\n2026-01-01 00:00:00,000 INFO mnemo.access: GET / 200\x1b[2J")
    except ValueError:
        record = logging.LogRecord("mnemo.errors", logging.ERROR, __file__, 0, "bug", None, sys.exc_info())
    first, *rest = TextFormatter().format(record).split("\n")
    assert first.endswith(" ERROR mnemo.errors: bug") and rest[0] == "  Traceback (most recent call last):", rest
    assert all(line.startswith("  ") for line in rest) and "\x1b" not in "".join(rest), rest
    assert rest[-2:] == ["  ValueError: student abc", "  2026-01-01 00:00:00,000 INFO mnemo.access: GET / 200\\x1b[2J"]


def test_route_path_is_the_path_below_the_root_path_as_starlette_routes_it():
    def route(path: str, root_path: str = "") -> str:
        return service_logging.route_path({"path": path, "root_path": root_path})

    assert route("/api", "/api") == "/"  # the root itself: Starlette's routing takes it for "/" (redirected there)
    assert route("/api/students", "/api") == "/students"
    assert route("/apiary", "/api") == "/apiary"  # another path that only starts with the same letters
    assert route("/students") == "/students"


def test_warnings_held_back_are_counted_when_their_second_is_over_without_an_event_loop(capsys):
    configure_logging("info", "text")
    logger = logging.getLogger("mnemo.test.flood")
    logger.addFilter(service_logging.EverySecondAtMost(["flood %d"]))
    for index in range(3):
        logger.warning("flood %d", index)  # no event loop runs in this thread
    time.sleep(1.5)
    write_out_logs()
    lines = [line.split(": ", 1)[1] for line in capsys.readouterr().err.splitlines() if "mnemo.test.flood:" in line]
    assert lines == ["flood 0", "flood 2 (2 more since the last line)"]
