"""Directory trees a sandbox may have made: remove, copy, fsync, walk, measure and re-own them safely.

Everything a sandbox writes is hostile, so every function here:

* never follows a symlink (directories are opened ``O_DIRECTORY | O_NOFOLLOW`` relative to their
  parent's descriptor, files ``O_NOFOLLOW``; metadata calls use ``follow_symlinks=False`` or an
  ``O_PATH`` descriptor through ``/proc/self/fd``);
* never recurses in Python: each walk is a loop over an explicit stack, so depth 100000 works;
* never builds a path longer than one name: everything below the root is reached through directory
  descriptors (``dir_fd=``), so trees deeper than ``PATH_MAX`` work;
* keeps at most :data:`FD_WINDOW` directory descriptors open however deep the tree is: descending
  past the window closes the oldest one, and going back up re-opens a closed parent through ``..``
  of its child, checked to be the same directory (``st_dev``/``st_ino``) it was on the way down;
* never crosses into another filesystem below the root (a mount point inside a tree is an error
  for the functions that change or copy it, and is not entered by the ones that only read).

All functions are synchronous (run them with ``asyncio.to_thread``) and raise ``OSError`` for what the
filesystem refuses, plus :class:`TreeLimitExceeded` and :class:`CopyCancelled` from :func:`copy_tree`.
"""

from __future__ import annotations

from ._copy import CopyCancelled, OwnerMap, TreeLimitExceeded, copy_tree
from ._owner import shift_owner
from ._remove import QUARANTINE, clear_dir, move_aside, remove_tree
from ._sync import FSYNC_LIMIT, fsync_dir, fsync_tree, tree_usage
from ._walk import FD_WINDOW, WalkDir, walk

__all__ = [
    "FD_WINDOW",
    "FSYNC_LIMIT",
    "QUARANTINE",
    "CopyCancelled",
    "OwnerMap",
    "TreeLimitExceeded",
    "WalkDir",
    "clear_dir",
    "copy_tree",
    "fsync_dir",
    "fsync_tree",
    "move_aside",
    "remove_tree",
    "shift_owner",
    "tree_usage",
    "walk",
]
