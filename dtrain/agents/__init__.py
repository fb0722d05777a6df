"""The launcher's side of the agents: one session per host, and the group that owns them."""
