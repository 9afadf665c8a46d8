"""What every layer may use: the error root, the plugin registry, networking, run directories, interrupts."""
