"""The image tests use the session's ``docker`` engine and ``images`` fixtures
(``localkube.fixtures``): the same build the real node's pods run."""
