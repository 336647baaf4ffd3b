"""One module per `vla` subcommand: add_parser(subparsers, name, help) and run(args)."""
