"""Sandbox templates: the built-in rootfs builders, their cache, and importing rootfs layers.

builtin.py   the template catalog and ``ensure_builtin_templates`` (cache_dir/templates/<name>/)
busybox.py   the ``busybox`` rootfs (static busybox, a bash shim, root and user)
debian.py    the ``base`` rootfs (debootstrap bookworm minbase + bash, python3, CA bundle)
importer.py  ``import_template``: a rootfs becomes a read-only layer under state_dir/layers/

Template builds (imported by the node and the API, not re-exported here):
build.py          ``BuildService``: the facade of the E2B template API engine (the build queue, pulls as
                  templates, deletion); executor.py, sandbox.py, runner.py, seal.py, pulls.py,
                  layers.py, records.py and model.py do its jobs (see model.py)
steps.py          build steps, pure: parsing, metadata, cache keys, the SDK's COPY files hash
buildlog.py       a build's status and log as the SDK polls them
uploads.py        COPY uploads, content-addressed by files hash
guest_helper.py   stdlib script run inside build sandboxes (accounts, mkdir, COPY unpacking)
dockerfile.py     a Dockerfile as a build request (the SDK's converter), for ``warren build``
"""

from warren.templates.builtin import (
    BUILTIN_TEMPLATES,
    BuiltinTemplate,
    Progress,
    TemplateInfo,
    ensure_builtin_templates,
    load_template_info,
    templates_root,
)
from warren.templates.busybox import build_busybox_rootfs
from warren.templates.debian import build_base_rootfs, host_debian_mirror
from warren.templates.importer import import_template

__all__ = [
    "BUILTIN_TEMPLATES",
    "BuiltinTemplate",
    "Progress",
    "TemplateInfo",
    "build_base_rootfs",
    "build_busybox_rootfs",
    "ensure_builtin_templates",
    "host_debian_mirror",
    "import_template",
    "load_template_info",
    "templates_root",
]
