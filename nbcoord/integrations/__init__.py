"""Integrations plug into nbcoord by registering: a snapshot source, a stopper, owners on threads.

Each one is a module here that never imports its framework itself; it installs when the user imports it.
"""
