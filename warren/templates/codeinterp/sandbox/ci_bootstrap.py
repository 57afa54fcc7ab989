"""Build step of the code-interpreter template: a venv with the kernel and the data libraries, offline.

Runs in the build sandbox as root with the base template's python3 (stdlib only; never imported by warren):

    python3 ci_bootstrap.py VENV WHEELS PACKAGE...

WHEELS holds every wheel needed (the node downloaded them on the host with the host's own pip and package
index configuration: ``warren.templates.codeinterp.wheels``), pip's among them. The base image has no pip
(nor ensurepip), so pip runs from its wheel to install itself and PACKAGE... into the venv from WHEELS
alone; the build sandbox needs no network.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import venv


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit("usage: ci_bootstrap.py VENV WHEELS PACKAGE...")
    target, wheels, packages = argv[0], argv[1], argv[2:]
    pips = sorted(glob.glob(os.path.join(wheels, "pip-*-py3-none-any.whl")))
    if not pips:
        raise SystemExit(f"no pip wheel in {wheels}")
    print(f"creating the venv {target}", flush=True)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(target)
    python = os.path.join(target, "bin", "python")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
           "PIP_PROGRESS_BAR": "off", "PIP_ROOT_USER_ACTION": "ignore", "PIP_CONFIG_FILE": os.devnull}
    print(f"installing pip and {' '.join(packages)} from {len(os.listdir(wheels))} wheels", flush=True)
    subprocess.run([python, os.path.join(pips[-1], "pip"), "install", "--no-index", "--find-links", wheels,
                    "pip", *packages], env=env, check=True)
    subprocess.run([python, "-c", "import ipykernel, jupyter_client, numpy, pandas, matplotlib"], env=env, check=True)
    print("code interpreter packages installed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
