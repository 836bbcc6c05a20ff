"""oms-mpijob-proxy: a reverse proxy in front of OpenM++ oms that runs MPI model runs as MPIJobs."""

__version__ = "0.1.0"
