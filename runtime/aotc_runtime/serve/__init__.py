"""`aotc serve`: a package behind HTTP. protocol.py is the request and response format,
checked against the package's signature, independent of the server that carries it."""
