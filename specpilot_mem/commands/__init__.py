"""One module per CLI verb; see ``specpilot_mem.main`` for the protocol."""
