"""graft-roles-plugin: the last rank of a multi-rank run is a "helper" that does not train."""
