"""`dtrain launch` from request to result: lifecycle, supervisor, sync, results."""
