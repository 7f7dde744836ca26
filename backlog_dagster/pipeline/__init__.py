"""What a declared pipeline is: its config models, the layout of its results, the sketches
they merge, and where its settings and relative paths are read from."""
