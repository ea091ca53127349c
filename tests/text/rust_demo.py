"""The circuit rust_circuit's printing demo (``printing_parsing``) prints and diffs, shared by the
tests of the print options and of ``diff_circuits``."""

from circuits.text import parse

DEMO = parse("""
'a0' Add
  'a1' Add
    'sym1' [2] Symbol
    'sym2' [2] Symbol
  'a2' Add
    'sym1'
    'sym2'
    'sym2'
""")
