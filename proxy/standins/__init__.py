"""Stand-ins for oms and the Kubernetes API that speak the real wire protocols."""
