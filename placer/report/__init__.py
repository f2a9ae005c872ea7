"""Reports of a plan and a run: the HTML page (``html.render``), its charts (``plots``),
the numbers behind them (``tables``) and Chrome trace files (``trace``).

Nothing is imported here: matplotlib and jinja2 load only when a report is written, so
the command line starts fast."""
