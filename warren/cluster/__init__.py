"""Many nodes, one endpoint: node membership in Redis, placement, and the stateless gateway."""
