"""Submit: ``POST /api/run`` → MPIJob, in the order a request flows.

``decode`` parses the body like oms (Go's encoding/json); ``validate`` checks it against the
config's limits; ``template`` loads the operator's MPIJob template; ``render`` (pure) builds the
MPIJob and its ConfigMap; ``handler`` ties them together, creates the objects and answers.
"""
