"""The launcher's side of the agents: one session per host (`session`), the group that owns them
and the fan-out of one request to many (`group`), and the protocol's ops as typed calls (`ops`)."""
