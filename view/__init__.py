"""The trajectory and run viewer (`sleuth view`): run directories read through an index, served as JSON to
a static page, or exported as one HTML file. Only the CLI imports it."""
