"""What every method shares: the Method base, budgets, parameters, errors, the catalog and the registry."""
