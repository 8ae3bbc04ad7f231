"""`from redline.serve.client import RedlineClient`: the client lives in `redline.cluster.client` (the
`http` detector kind uses it too); this name stays for users' code."""

from redline.cluster.client import RedlineClient, base_url

__all__ = ["RedlineClient", "base_url"]
