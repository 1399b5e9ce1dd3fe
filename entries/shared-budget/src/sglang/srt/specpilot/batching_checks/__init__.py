"""One module per batching entry, each defining ``check(server_args)`` (``batching_args.check_server_args``)."""
