"""Test configuration: registers the ``gpu`` marker (cupy tests, skipped without cupy and a GPU)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and cupy; skipped elsewhere")
