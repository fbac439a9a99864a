"""What every node keeps about itself, main or child: its audit chain's
hashing (``chain``), the chain's head signed with the node key and kept
apart from the database (``anchor``), and refusals counted in bounded
records (``denials``). Neither the authority's nor the agent's: both import
it, and it imports neither (this package's ``__init__`` imports nothing, so
the store below it can use ``chain``)."""
