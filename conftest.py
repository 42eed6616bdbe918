pytest_plugins = ["localplane.pytest_plugin"]
