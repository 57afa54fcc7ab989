"""The unmodified ``e2b-code-interpreter`` SDK, sync and async, on runc and gVisor (issue 14).

The template is built once per machine: the session fixture asks the node for it
(``POST /warren/templates/ensure``), which imports it from the setup cache (DEFAULT_CACHE) or builds it
there (minutes: pip installs the kernel, numpy, pandas and matplotlib from the package index). Without a
package index reachable from the host (the node fetches the wheels with the host's pip) they skip.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.framework.node import Node, running_node
from warren.templates.codeinterp import recipe

BUILD_TIMEOUT_S = 1800.0
LINES = 10_000


def _ensure(node: Node, name: str) -> tuple[dict[str, object], list[str]]:
    lines: list[str] = []
    with node.client() as c:
        c.timeout = BUILD_TIMEOUT_S
        with c.stream("POST", "/warren/templates/ensure", json={"name": name}) as r:
            assert r.status_code == 200, r.read()
            for raw in r.iter_lines():
                doc = json.loads(raw)
                if doc["event"] == "log":
                    lines.append(str(doc["message"]))
                elif doc["event"] == "error":
                    if "pip download" in str(doc["message"]):
                        pytest.skip(f"the package index is unreachable from this host: {doc['message']}")
                    pytest.fail(f"building {name} failed: {doc['message']}\n" + "\n".join(lines[-40:]))
                else:
                    return dict(doc["template"]), lines
    pytest.fail(f"the ensure stream of {name} ended without a result:\n" + "\n".join(lines[-40:]))


@pytest.fixture(scope="session")
def ci_built(node: Node) -> str:
    """``code-interpreter-v1`` on the node (built or imported from the setup cache)."""
    started = time.monotonic()
    template, lines = _ensure(node, recipe.NAME)
    print(f"{recipe.NAME} ready in {time.monotonic() - started:.0f}s: {lines[-1] if lines else ''}")
    return str(template["templateID"])


@pytest.fixture
def ci_template(runtime: str, ci_built: str, node: Node) -> str:
    if runtime == "runc":
        return recipe.NAME
    _ensure(node, recipe.GVISOR_NAME)  # sealed as a memory snapshot with the kernel started
    return recipe.GVISOR_NAME


@pytest.fixture
def ci(ci_template: str) -> Iterator[Sandbox]:
    box = Sandbox.create(template=ci_template, timeout=600, envs={"SANDBOX_VAR": "from-create"})
    try:
        yield box
    finally:
        Sandbox.kill(box.sandbox_id)


# ---------------------------------------------------------------------------------------- sync


def test_state_is_kept_across_cells(ci: Sandbox) -> None:
    assert ci.run_code("x = 41").error is None
    execution = ci.run_code("x + 1")
    assert execution.text == "42"
    assert execution.results[0].is_main_result
    assert execution.execution_count == 2


def test_matplotlib_chart_comes_back_as_png(ci: Sandbox) -> None:
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()"
    execution = ci.run_code(code)
    assert execution.error is None, execution.error
    pngs = [r.png for r in execution.results if r.png]
    assert len(pngs) == 1
    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")


def test_pandas_data_frame(ci: Sandbox) -> None:
    execution = ci.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert execution.error is None, execution.error
    result = execution.results[0]
    assert result.is_main_result
    assert result.data == {"a": [1, 2], "b": ["x", "y"]}
    assert result.html is not None and "<table" in result.html
    assert "a" in (result.text or "")


def test_exception_with_traceback(ci: Sandbox) -> None:
    seen = []
    execution = ci.run_code("def f():\n    return 1 / 0\nf()", on_error=seen.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "f()" in execution.error.traceback and "ZeroDivisionError" in execution.error.traceback
    assert seen == [execution.error]
    assert ci.run_code("1 + 1").text == "2"  # the kernel goes on


def test_stdout_and_stderr_callbacks_in_order(ci: Sandbox) -> None:
    events: list[tuple[str, str]] = []
    code = (
        "import sys, time\n"
        "for i in range(3):\n"
        "    print(f'out{i}', flush=True); time.sleep(0.1)\n"
        "    print(f'err{i}', file=sys.stderr, flush=True); time.sleep(0.1)\n"
    )
    execution = ci.run_code(
        code,
        on_stdout=lambda m: events.append(("out", m.line)),
        on_stderr=lambda m: events.append(("err", m.line)),
    )
    assert execution.error is None
    expected = [(s, f"{s}{i}\n") for i in range(3) for s in ("out", "err")]
    assert events == expected
    assert execution.logs.stdout == ["out0\n", "out1\n", "out2\n"]
    assert execution.logs.stderr == ["err0\n", "err1\n", "err2\n"]


def test_contexts_are_isolated_listed_and_removed(ci: Sandbox) -> None:
    first = ci.create_code_context()
    second = ci.create_code_context(cwd="/tmp", language="python")
    assert (first.language, second.cwd) == ("python", "/tmp")
    ci.run_code("secret = 1", context=first)
    missing = ci.run_code("secret", context=second)
    assert missing.error is not None and missing.error.name == "NameError"
    assert ci.run_code("import os; os.getcwd()", context=second).text == "/tmp"
    assert ci.run_code("secret", context=first).text == "1"
    ids = {c.id for c in ci.list_code_contexts()}
    assert {first.id, second.id} <= ids
    ci.remove_code_context(second)
    assert second.id not in {c.id for c in ci.list_code_contexts()}


def test_restart_of_a_context(ci: Sandbox) -> None:
    context = ci.create_code_context()
    ci.run_code("kept = 'no'", context=context)
    ci.restart_code_context(context)
    execution = ci.run_code("kept", context=context)
    assert execution.error is not None and execution.error.name == "NameError"


def test_env_vars_of_the_sandbox_and_of_a_call(ci: Sandbox) -> None:
    assert ci.run_code("import os; os.environ.get('SANDBOX_VAR')").text == "from-create"
    assert ci.run_code("os.environ.get('CALL_VAR')", envs={"CALL_VAR": "one-call"}).text == "one-call"
    assert ci.run_code("str(os.environ.get('CALL_VAR'))").text == "None"  # only for that call


def test_ten_thousand_lines_intact(ci: Sandbox) -> None:
    execution = ci.run_code(f"for i in range({LINES}):\n    print(f'line {{i}}')")
    assert execution.error is None
    assert "".join(execution.logs.stdout) == "".join(f"line {i}\n" for i in range(LINES))


def test_two_concurrent_calls_on_one_context_are_serialised(ci: Sandbox) -> None:
    spans: list[tuple[float, float]] = []
    code = "import time\nstart = time.time(); time.sleep(1.0); (start, time.time())"

    def run() -> None:
        text = ci.run_code(code).text
        assert text is not None
        start, end = (float(v) for v in text.strip("()").split(","))
        spans.append((start, end))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(spans) == 2
    first, second = sorted(spans)
    assert first[1] <= second[0], spans


def test_pause_and_resume_keep_the_kernel_state(ci: Sandbox) -> None:
    ci.run_code("import random\nkept = random.random()")
    before = ci.run_code("kept").text
    assert ci.pause() is True
    resumed = Sandbox.connect(ci.sandbox_id)
    assert resumed.run_code("kept").text == before


def test_execution_timeout_interrupts_the_kernel(ci: Sandbox) -> None:
    from e2b import TimeoutException

    ci.run_code("survivor = 7")
    with pytest.raises(TimeoutException):
        ci.run_code("import time\ntime.sleep(60)", timeout=2)
    started = time.monotonic()
    assert ci.run_code("survivor").text == "7"  # interrupted, not restarted: the state is there
    assert time.monotonic() - started < 15


def test_first_use_on_a_fresh_node_with_the_sdk_default_template(
    ci_built: str, tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that has never seen the template gets it on the first ``Sandbox.create()`` (from the setup
    cache the session node filled; the create waits for the import)."""
    with running_node(tmp_path_factory.mktemp("fresh") / "state", runsc=patched_runsc) as fresh:
        for k, v in fresh.env().items():
            monkeypatch.setenv(k, v)
        box = Sandbox.create()
        try:
            assert box.run_code("6 * 7").text == "42"
        finally:
            box.kill()
        log = fresh.log_path.read_text()
        assert f"{recipe.NAME}: importing the layer" in log


KERNEL_AGE = (
    "import os\n"
    "ticks = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n"
    "float(open('/proc/uptime').read().split()[0]) - ticks / os.sysconf('SC_CLK_TCK')"
)
"""How long ago the kernel process started, in seconds (runc shares the host's clock and uptime)."""


def test_runc_warm_pool_spares_have_the_kernel_running(
    ci_built: str, tmp_path_factory: pytest.TempPathFactory, patched_runsc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runc node with a warm pool: a spare of ``code-interpreter-v1`` runs its start command (the server
    and its default kernel) before any create, so a claim's first ``run_code`` finds the kernel up; the
    sandbox's env vars still reach the code, through the server, not the kernel's start."""
    state = tmp_path_factory.mktemp("pooled") / "state"
    with running_node(state, runsc=patched_runsc, extra_env={"WARREN_WARM_POOL": "1"}) as pooled:
        for k, v in pooled.env().items():
            monkeypatch.setenv(k, v)
        _ensure(pooled, recipe.NAME)
        Sandbox.create(timeout=60).kill()  # the template's first create: a miss, and its shelf starts filling
        deadline = time.monotonic() + 120
        while _shelf(pooled)["ready"] < 1:
            assert time.monotonic() < deadline, f"no spare: {_shelf(pooled)}"
            time.sleep(0.2)
        asked = time.monotonic()
        box = Sandbox.create(timeout=120, envs={"SANDBOX_VAR": "from-create"})
        try:
            age = float(box.run_code(KERNEL_AGE).text or "0")
            assert age > time.monotonic() - asked  # the kernel was up before the create was asked for
            assert _shelf(pooled)["hits"] == 1
            assert box.run_code("import os; os.environ.get('SANDBOX_VAR')").text == "from-create"
            # The kernel process itself started with the template's env only (os.environ is the server's push).
            assert box.run_code("b'SANDBOX_VAR=' in open('/proc/self/environ', 'rb').read()").text == "False"
        finally:
            box.kill()


def _shelf(node: Node) -> dict[str, int]:
    with node.client() as c:
        pool: dict[str, dict[str, int]] = c.get("/health").json()["warmPool"]
    return next((v for k, v in pool.items() if k.endswith("/runc")), {"ready": 0, "hits": 0})


def test_unknown_language_is_a_clear_error(ci: Sandbox) -> None:
    from e2b import SandboxException

    with pytest.raises(SandboxException, match="not supported by this template"):
        ci.run_code("1", language="cobol")


# ---------------------------------------------------------------------------------------- async


async def test_async_sdk(ci_template: str) -> None:
    sbx = await AsyncSandbox.create(template=ci_template, timeout=600, envs={"SANDBOX_VAR": "async"})
    try:
        await sbx.run_code("y = 20")
        assert (await sbx.run_code("y * 2 + 2")).text == "42"

        chart = await sbx.run_code("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()")
        assert any(r.png and base64.b64decode(r.png).startswith(b"\x89PNG") for r in chart.results)

        frame = await sbx.run_code("import pandas as pd\npd.DataFrame({'n': [3]})")
        assert frame.results[0].data == {"n": [3]}

        failed = await sbx.run_code("raise ValueError('bad')")
        assert failed.error is not None and (failed.error.name, failed.error.value) == ("ValueError", "bad")
        assert "ValueError" in failed.error.traceback

        events: list[str] = []

        async def on_err(m: object) -> None:
            events.append(f"err:{m}")

        code = "import sys, time\nprint('a', flush=True); time.sleep(0.1)\nprint('b', file=sys.stderr, flush=True)"
        await sbx.run_code(code, on_stdout=lambda m: events.append(f"out:{m}"), on_stderr=on_err)
        assert events == ["out:a\n", "err:b\n"]

        context = await sbx.create_code_context()
        await sbx.run_code("z = 1", context=context)
        assert (await sbx.run_code("'z' in dir()")).text == "False"
        await sbx.restart_code_context(context)
        assert (await sbx.run_code("'z' in dir()", context=context)).text == "False"
        assert context.id in {c.id for c in await sbx.list_code_contexts()}
        await sbx.remove_code_context(context.id)

        env = await sbx.run_code("import os; (os.environ['SANDBOX_VAR'], os.environ['V'])", envs={"V": "call"})
        assert env.text == "('async', 'call')"

        many = await sbx.run_code(f"print('\\n'.join(str(i) for i in range({LINES})))")
        assert "".join(many.logs.stdout) == "".join(f"{i}\n" for i in range(LINES))

        slow = "import time\ns = time.time(); time.sleep(0.8); (s, time.time())"
        a, b = await asyncio.gather(sbx.run_code(slow), sbx.run_code(slow))
        spans = sorted(tuple(float(v) for v in (r.text or "").strip("()").split(",")) for r in (a, b))
        assert spans[0][1] <= spans[1][0], spans

        await sbx.run_code("kept = 'across pause'")
        assert await sbx.pause() is True
        resumed = await AsyncSandbox.connect(sbx.sandbox_id)
        assert (await resumed.run_code("kept")).text == "across pause"
    finally:
        await AsyncSandbox.kill(sbx.sandbox_id)
