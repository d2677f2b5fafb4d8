"""Import-time stub of `flashinfer` for the offline GPU machine: see ../_import_stub.py."""

from _import_stub import install

__path__: list[str] = []  # a package, so `import flashinfer.x` reaches the stub finder
install(globals())
