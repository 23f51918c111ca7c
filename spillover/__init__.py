"""The `spillover` command line: the top layer, over bench, serve_apps, cluster and router."""
