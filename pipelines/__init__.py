"""How work flows: Ray Data graphs composed of actors, their schemas and reports."""
