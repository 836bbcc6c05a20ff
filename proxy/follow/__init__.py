"""Follow: the clients' polling of launched runs (log pages, status, stop, jobs page).

``informer`` keeps a watch running; ``cache`` is the watch-based cache of our MPIJobs and their
pods; ``runinfo``, ``launcherlog`` and ``view`` (pure) turn them into a run's state and log
lines; ``omsshapes`` (pure) builds the oms answer shapes; ``handlers`` answers the routes.
"""
