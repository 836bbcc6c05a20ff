"""Pass-through: every request the proxy does not answer itself goes to oms, streamed.

``forward`` relays one exchange; ``body`` reads the client's body (streamed or bounded);
``client`` is the pooled HTTP/1.1 client to oms; ``headers`` the pure header rules.
"""
