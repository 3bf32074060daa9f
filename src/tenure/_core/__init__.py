"""tenure's sans-IO layer: what every primitive shares, with no client and no I/O.

:mod:`tenure._core.values` holds the conversions every module needs (reply
text, durations checked and turned into whole milliseconds).
"""
