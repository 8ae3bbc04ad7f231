"""Attack engine: goals, transformations, constraints, search methods, recipes, the attacker."""

# the modules other packages may import (a test holds every import from outside to this list)
__all__ = ["attacker", "goals", "recipes", "resources"]
