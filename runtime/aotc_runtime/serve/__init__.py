"""`aotc serve` / `aotc-serve`: a package behind HTTP on Ray Serve (the runtime's `serve` extra).
protocol.py is the request and response format, checked against the package's signature,
independent of the server that carries it; command.py is the command."""
