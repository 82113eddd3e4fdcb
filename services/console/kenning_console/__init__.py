"""``kenning console``: the web console, server-rendered with Starlette and Jinja2 (no build
step, nothing loaded from the internet: the CSS and the one script are in ``static/``)."""
