"""The `sleuth` command: one module per subcommand group."""
