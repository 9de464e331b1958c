"""graft-demo-plugin: a third-party Graft plugin used by Graft's own tests."""
