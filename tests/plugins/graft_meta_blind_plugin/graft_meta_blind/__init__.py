"""graft-meta-blind-plugin: a plugin that silently does nothing on a ``model.path`` run."""
