"""Repository-wide pytest plugins: the Kubernetes cluster fixture lives in e2e/localkube."""

pytest_plugins = ["localkube.fixtures"]
