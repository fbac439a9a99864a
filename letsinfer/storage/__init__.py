"""The storage lifecycle of one node's home: what it holds (``node usage``),
what may be freed and why (``node cleanup``), and which nodes download a model
again when a stopped group starts (``model start``)."""
