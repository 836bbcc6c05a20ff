"""The proxy's own clients of the outside systems: one module (one choke point) per system.

``kube``: every Kubernetes API call, its retries and the classification of its failures.
``oms``: the proxy's own calls to oms (model lookups, run state, readiness), with one
translation of timeouts and connection errors.
"""
