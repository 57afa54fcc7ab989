"""The child start without a Python ``preexec_fn``: same user, groups, signals and OOM score as before.

Each case runs the spawner in a fresh interpreter (the agent's position: root, its own OOM score
set at start), so the score it holds over a fork is its own and not the test runner's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys
    from warren.guest.spawning import Spawner
    from warren.guest.users import User

    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(sys.argv[1])
    except PermissionError:  # lowering needs CAP_SYS_RESOURCE, which a root inside some containers lacks
        sys.exit(77)
    spawner = Spawner()
    REPORT = "cat /proc/self/oom_score_adj; id -u; id -g; id -G; grep -E '^Sig(Ign|Blk)' /proc/self/status"
    nobody = User(name="nobody", uid=65534, gid=65534, home="/", shell="/bin/sh", groups=(65534, 100))
    child = spawner.popen(
        ["/bin/sh", "-c", REPORT],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None, cwd="/", env={"PATH": "/usr/bin:/bin"},
        user=nobody, pty=False,
    )
    out, _ = child.communicate()
    print(out.decode(), end="")
    print("agent", open("/proc/self/oom_score_adj").read().strip())
    print("fast", spawner._fast(nobody, False))
    """
)


def _spawn_with_agent_score(score: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, score], capture_output=True, text=True, env=env)
    if done.returncode == 77:
        pytest.skip(f"this process cannot set its OOM score to {score}")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
@pytest.mark.parametrize("score", ["-998", "0", "300"])  # 300: the agent holds 0 over the fork, then takes 300 back
def test_child_starts_as_the_user_with_oom_zero_and_default_signals(score: str) -> None:
    lines = _spawn_with_agent_score(score)
    assert lines[0] == "0"  # the child's OOM score, whatever the agent's own
    assert lines[1:4] == ["65534", "65534", "65534 100"]
    assert "SigIgn:\t0000000000000000" in lines and "SigBlk:\t0000000000000000" in lines
    assert f"agent {score}" in lines  # the agent holds its own score again after the fork
    assert "fast True" in lines
