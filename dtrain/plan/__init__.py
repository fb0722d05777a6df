"""Pure planning: the hosts file, the plan's types, the planner, framework env builders.

Imports only the standard library, `dtrain.errors`, itself and `dtrain.remote.proto` (a
stdlib-only leaf that names the tag variables every task carries)."""
