"""Pure planning: the hosts file, the plan's types, the planner, framework env builders.

Imports only the standard library, `dtrain.errors` and itself."""
