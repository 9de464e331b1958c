"""graft-myfeature: the example Graft plugin of docs/plugins.md."""
