"""How POST /knowledge-trace writes its probability arrays."""

from __future__ import annotations

import numpy as np
import orjson

from app.core.responses import dumps
from app.tasks.knowledge_trace.rest import json_floats


def test_probabilities_are_written_to_float32_resolution():
    values = np.array([[0.63696164, 1e-9, 1.0], [0.5, 0.12345678, 0.99999994]], dtype=np.float32)
    written = orjson.loads(dumps(json_floats(values)))
    np.testing.assert_allclose(written, values, atol=5e-8, rtol=0)
    assert written == [[0.6369616, 0.0, 1.0], [0.5, 0.1234568, 0.9999999]]
    assert json_floats(None) is None
