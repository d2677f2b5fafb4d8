"""Import-time stub of `deep_gemm` for the series' tests on the offline GPU machine.

Its PyPI wheel crashes with the machine's torch (the `deepgemm` stage builds DeepGEMM from source
when carried), but upstream's `dsa_backend` imports it at module level under `if is_cuda():`, so
on a GPU every module that imports the C4 indexer fails to import without it. Where no real
`deep_gemm` imports, `verify/gpu/run.sh tests` puts this folder on PYTHONPATH (tests only: the
tiers and the bench never see it) so the series' tests can import the indexer; every name raises
when called (see ../../import_stubs/_import_stub.py), so a test that reached DeepGEMM would fail
loudly, not pass.
"""

from _import_stub import install

__path__: list[str] = []
install(globals())
