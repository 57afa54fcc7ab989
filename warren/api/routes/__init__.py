"""One module per resource: parse the request, call the orchestrator, serialize the result."""
