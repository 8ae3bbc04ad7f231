"""Attack engine: goals, transformations, constraints, search methods, recipes, the attacker."""
