"""What a user's ``conftest.py`` adds to test an app instrumented with otelkit: its fixtures."""

pytest_plugins = ["otelkit.testing.pytest_plugin"]
