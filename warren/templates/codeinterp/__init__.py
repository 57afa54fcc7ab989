"""The ``code-interpreter-v1`` template: E2B's code interpreter (a Jupyter kernel behind port 49999).

    recipe      the build on ``base``: files, pip index, steps, start and ready commands
    cache       the built layer in the setup cache (a machine builds it at most once)
    provision   a node makes the template exist: from the cache, else by building it (first use)
    sandbox/    the files that run inside the sandbox (server, kernels, build bootstrap); not imported
"""

from warren.templates.codeinterp.provision import NAMES, Job, Provisioner
from warren.templates.codeinterp.recipe import GVISOR_NAME, NAME, PORT, RECIPE

__all__ = ["GVISOR_NAME", "NAME", "NAMES", "PORT", "RECIPE", "Job", "Provisioner"]
