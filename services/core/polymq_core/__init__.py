"""polymq core: the broker node (routing, sessions, stores, cluster)."""
