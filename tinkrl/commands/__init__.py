"""`tinkrl` subcommands: each module parses its command line and wires the library parts together."""
