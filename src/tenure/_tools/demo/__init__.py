"""``tenure demo``: the Redis in Action marketplace, guarded three ways.

Not part of the library's API. :mod:`tenure._tools.demo.market` holds the market
(its Lua scripts are in this package's ``lua`` folder);
:mod:`tenure._tools.demo.run` runs the trading processes and prints the table.
"""
