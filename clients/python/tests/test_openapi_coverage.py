"""The client covers every operation of the API document."""

import json
import os

import starlease

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "httpapi", "openapi.json")


def test_client_covers_every_operation() -> None:
    with open(DOC) as f:
        doc = json.load(f)
    ops = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if isinstance(op, dict) and "operationId" in op:
                ops[op["operationId"]] = (method.upper(), path)
    assert set(ops) == set(starlease.ROUTES), "operations missing from or unknown to the client"
    for op_id, (method, path, attr) in starlease.ROUTES.items():
        assert ops[op_id] == (method, path), op_id
        assert callable(getattr(starlease.Client, attr)), op_id
        assert getattr(starlease.Client, attr).__doc__, op_id + " is undocumented"


def test_every_operation_is_exercised() -> None:
    # Each method is called by name in the suite's own tests.
    here = os.path.dirname(__file__)
    text = "".join(open(os.path.join(here, f)).read() for f in os.listdir(here)
                   if f.startswith("test_") and f != os.path.basename(__file__))
    for op_id, (_, _, attr) in starlease.ROUTES.items():
        assert "." + attr + "(" in text, "no test calls Client.%s (%s)" % (attr, op_id)
