"""The command line: thin wrappers that parse arguments, build configs and call the library."""
