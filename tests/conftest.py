pytest_plugins = [
    "tests.framework.agent",
    "tests.framework.rootfs",
    "tests.framework.runsc",
    "tests.framework.runtime",
]
