from tests.fakehub.fixtures import fakehub, hub_env  # noqa: F401
