"""The circuit text format: one node per line, children indented under their parent.

A line is ``[serial] ['name'] [shape] Type [payload]``::

    't.loss' Einsum a,->a
      'll' GeneralFunction gen_index_at_0_batch_x_c
        ...
      'nll.neg' [] Scalar -1

- children are indented two spaces under their parent;
- shapes are printed for Array, Scalar, Symbol and Index (elsewhere they are implied; the
  ``shapes=True`` option prints them everywhere, and the parser checks every printed shape);
- a name shared by two or more distinct nodes, or an unnamed node, gets a serial number counted in
  print order from 0; a node met again prints only its identifier (``'idxed_embeds'``,
  ``20 'ln.mean_subbed'``, or ``20`` when unnamed) and no children;
- payloads: Array the first 24 hex digits of its content hash (any unique prefix parses), Scalar
  its shortest positional value (``0.00001``, ``-10000``, ``nan``), Symbol ``[dtype] [uuid]``,
  Einsum ``qc,kc,,qk->qk``, GeneralFunction its registered name, Index ``[0,:,:]`` / ``[1:-1]`` /
  ``[[1,3,5],:]``, Rearrange ``(h d) s -> h s d h=2``, Concat its axis, Tag its uuid;
- ``# comments`` and blank lines are ignored; a text may hold several roots sharing references;
- no trailing newline after the last line.

Deep circuits.  Indenting a 50,000-deep chain naively would take gigabytes, so the printer never
indents more than ``max_indent`` levels (default 64; the seed is 37 deep).  A node with children
that would start below that depth is printed as a reference, and its subtree is printed as a
*definition block* before the roots: a root line marked ``~``.  Definition blocks may refer to each
other (deepest first) and to nodes defined anywhere else in the text, even further down;
``parse_many`` returns only the unmarked roots and ``parse`` the last of them.  Here with a
(tiny) limit of one level:

>>> from circuits import GeneralFunction, Symbol
>>> e = Symbol((2,), name='x')
>>> for i in range(3):
...     e = GeneralFunction('exp', e, name=f'e{i}')
>>> print(to_text(e, max_indent=1))
~ 'e0' GeneralFunction exp
  'x' [2] Symbol
~ 'e1' GeneralFunction exp
  'e0'
'e2' GeneralFunction exp
  'e1'
>>> parse(to_text(e, max_indent=1)) == e
True

See ``circuits.text.printer`` for the print options and ``circuits.text.parser`` for parsing.

>>> from circuits import Add
>>> x = Symbol((2,), name='x')
>>> print(to_text(Add(x, x, name='y')))
'y' Add
  'x' [2] Symbol
  'x'
>>> parse(to_text(Add(x, x, name='y'))) == Add(x, x, name='y')
True
"""

from .parser import parse, parse_many
from .printer import dtype_commenter, print_many, size_threshold_commenter, to_text

__all__ = ["to_text", "print_many", "parse", "parse_many", "size_threshold_commenter", "dtype_commenter"]
