"""Routes into ipykernel and IPython: the fast comm route, the control route, output routing, shutdown."""
