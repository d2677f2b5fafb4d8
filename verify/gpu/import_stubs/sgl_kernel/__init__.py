"""Import-time stub of `sgl_kernel` for the offline GPU machine: see ../_import_stub.py."""

from _import_stub import install

__path__: list[str] = []  # a package, so `import sgl_kernel.x` reaches the stub finder
install(globals())
