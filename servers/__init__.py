"""Every server sleuth runs (`sleuth serve ...`), started, stopped and health-checked one way."""
