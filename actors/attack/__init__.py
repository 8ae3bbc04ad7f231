"""Attack engine: goals, transformations, constraints, search methods, recipes, the attacker."""

# the modules other packages may import (a test holds every import from outside to this list); the
# components (constraints, transformations, text) for benches that set them side by side with a reference
__all__ = ["attacker", "constraints", "goals", "recipes", "resources", "text", "transformations"]
