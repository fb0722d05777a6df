"""Finding and stopping job processes on every host: `dtrain ps`, `dtrain kill`, stale checks."""
