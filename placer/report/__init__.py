"""Reports of a plan and a run: the HTML page (``html.render``), its charts (``plots``),
the numbers behind them (``tables``) and Chrome trace files (``trace``)."""
from placer.report.html import render
from placer.report.trace import build_trace, validate_trace

__all__ = ["render", "build_trace", "validate_trace"]
