"""Retention and collection (DESIGN.md §9): what the agents' housekeeper and `dlctl gc` decide and
apply — retention by age and size, collection of truncated segments and their replicas
(``collect``), and their copies in the cold store (``offload``). ``dlctl.ops.gc`` turns them
into plans for the command line."""
