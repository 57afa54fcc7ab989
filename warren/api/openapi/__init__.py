"""The OpenAPI document served at ``/openapi.json``: a contract, not a sketch. Component schemas
(``schemas.py``), the table of operations (``operations.py``), the document built from them
(``document.py``). tests/unit/api checks it against the router; tests/e2e/test_openapi_fuzz.py runs
schemathesis over every operation of a real node and allows no 5xx."""

from .document import build_document
from .operations import OPERATIONS, Operation

OPENAPI = build_document()

__all__ = ["OPENAPI", "OPERATIONS", "Operation"]
