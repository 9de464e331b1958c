"""A plugin whose import fails, like one built against a missing dependency."""

raise ImportError("graft_broken needs the package 'not_installed_kernels', which is missing")
