"""`dtrain doctor` and launch's preflight: gather facts from every host, judge them."""
