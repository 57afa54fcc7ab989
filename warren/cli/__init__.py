"""The ``warren`` command line (Typer + Rich). No business logic lives here.

main.py           the Typer app, error display, ``main()``
node_cmds.py      serve, setup
sandbox_cmds.py   ls, start, exec, shell, rm, timeout
template_cmds.py  templates, template import
session.py        exec and PTY attach through the unmodified E2B SDK
client.py         the REST client; config.py where URL and key come from; output.py rendering
"""
