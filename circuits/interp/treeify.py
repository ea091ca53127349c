"""Treeification along a hypothesis: one copy of an input per owner of the paths that reach it.

Causal scrubbing feeds different data to different paths of one circuit.  ``treeify`` walks the
circuit from its output with a state (the claim that owns the path so far, and the child claims
the path may still enter), rebuilds each node once per distinct state, and replaces each input
Symbol ``x`` by ``x@k``: the input of sample slot ``k``.  A path belongs to the first claim site
it meets among its owner's children (``avoid`` nodes shut a child out of the paths through them);
an input reached while owned by a leaf claim reads that claim's datum, one reached while owned by
an internal claim (an unclaimed path) reads the claim's *other* slot.  Nodes whose states agree are
rebuilt once, so the circuit is copied only as deep as the hypothesis needs: the identity
hypothesis gives the circuit back with one renamed input.  Iterative (no recursion on the circuit).

>>> import numpy as np
>>> from circuits import Symbol, Add, Einsum, Scalar
>>> from circuits.interp import Claim
>>> x = Symbol((2,), name='x')
>>> a = Einsum.from_spec('a,->a', x, Scalar(2.0), name='A')
>>> b = Einsum.from_spec('a,->a', x, Scalar(3.0), name='B')
>>> out = Add(a, b, name='out')
>>> plan = plan_slots(Claim('out', children=[Claim('A')]))
>>> t = treeify(out, plan, {'x'})
>>> sorted(s.name for s in t.circuit.get('Symbol'))
['x@0', 'x@1']
"""

from __future__ import annotations

import hashlib
from typing import Iterable

from ..errors import CircuitError
from ..nodes import Circuit, Symbol
from ..traversal import parents_map, toposort
from .hypothesis import Claim

__all__ = ["SlotPlan", "plan_slots", "treeify", "Treeified"]


class SlotPlan:
    """A hypothesis flattened: claims in depth-first order with their parents, and the sample
    slots (``d``: each claim's datum, ``o``: what its unclaimed paths read).  Slot 0 is the
    reference datum.  A claim whose feature is exact shares its parent's slot; ``other='exact'``
    shares the claim's own slot; every other slot is drawn (``draws``: slot -> (claim index,
    parent slot, 'feature' | 'uniform'))."""

    def __init__(self, root: Claim):
        self.claims: list[Claim] = []
        self.parent: list[int] = []
        self.children: list[list[int]] = []
        index_of: dict[int, int] = {}
        for claim, parent, _ in root.walk():
            if id(claim) in index_of:
                raise CircuitError(f"claim {claim.name!r} appears twice in the hypothesis: a hypothesis is a "
                                   f"tree; build a second Claim for the second place")
            index_of[id(claim)] = len(self.claims)
            self.claims.append(claim)
            self.parent.append(-1 if parent is None else index_of[id(parent)])
            self.children.append([])
            if parent is not None:
                self.children[index_of[id(parent)]].append(len(self.claims) - 1)
        seen: dict[str, int] = {}
        for i, c in enumerate(self.claims):
            if c.name in seen:
                raise CircuitError(f"two claims are named {c.name!r}: give one of them name=... (names key "
                                   f"the random draws and the report)")
            seen[c.name] = i
        self.d: list[int] = []
        self.o: list[int | None] = []
        self.draws: dict[int, tuple[int, int, str]] = {}
        for i, c in enumerate(self.claims):
            if i == 0:
                d = 0
            elif c.feature.kind == "exact":
                d = self.d[self.parent[i]]
            else:
                d = self._new(i, self.d[self.parent[i]], "feature")
            self.d.append(d)
            if self.children[i]:
                self.o.append(d if c.other == "exact" else self._new(i, d, "uniform"))
            else:
                self.o.append(None)

    def _new(self, claim: int, parent_slot: int, kind: str) -> int:
        slot = len(self.draws) + 1
        self.draws[slot] = (claim, parent_slot, kind)
        return slot

    @property
    def n_slots(self) -> int:
        return len(self.draws) + 1

    def input_slot(self, owner: int) -> int:
        """The slot an input reads when the path's owner is claim ``owner``."""
        o = self.o[owner]
        return self.d[owner] if o is None else o

    def seed_key(self, slot: int) -> int:
        """A stable number for ``slot``'s draw (from its claim's name and role): adding a claim
        does not move the other claims' samples."""
        claim, _, kind = self.draws[slot]
        digest = hashlib.blake2b(f"{self.claims[claim].name}\0{kind}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")


def plan_slots(root: Claim) -> SlotPlan:
    """The ``SlotPlan`` of a hypothesis (validated as a tree with unique claim names)."""
    if not isinstance(root, Claim):
        raise CircuitError(f"a hypothesis is a Claim (the root claim, at the output), got {root!r}")
    return SlotPlan(root)


class Treeified:
    """``circuit``: the rebuilt circuit, whose inputs are ``'<input>@<slot>'`` Symbols;
    ``slots``: the slots it reads, sorted; ``owned``: claim index -> slots its paths read."""

    def __init__(self, circuit: Circuit, slots: list[int], owned: dict[int, set[int]]):
        self.circuit, self.slots, self.owned = circuit, slots, owned


def slot_name(input_name: str, slot: int) -> str:
    return f"{input_name}@{slot}"


def treeify(circuit: Circuit, plan: SlotPlan, input_names: Iterable[str]) -> Treeified:
    """Rebuild ``circuit`` so that every occurrence of an input (a Symbol named in
    ``input_names``) reads the slot of the claim that owns its path (see the module docstring).

    Raises ``CircuitError`` naming the claim when the root claim's site is not the output, when
    a claim's site matches nothing, does not depend on the inputs, or is not reached from its
    parent's site, and when one node is claimed by two sibling claims."""
    inputs = set(input_names)
    order = toposort(circuit)
    has_input: set[bytes] = set()
    for node in order:
        if (isinstance(node, Symbol) and node.name in inputs) or any(c.hash in has_input for c in node.children):
            has_input.add(node.hash)
    claims = plan.claims
    sites = [c.site.matches(circuit, order) for c in claims]
    avoid = [set().union(*(a.matches(circuit, order) for a in c.avoid)) for c in claims]
    if circuit.hash not in sites[0]:
        raise CircuitError(f"the root claim {claims[0].name!r} must have the circuit's output as its site; the "
                           f"output is {circuit.line()}: write Claim({circuit.name!r}, ...)")
    parents = parents_map(circuit)
    reach = [_ancestors(s, parents) for s in sites]

    entered = {0}
    owned: dict[int, set[int]] = {}
    memo: dict[tuple, Circuit] = {}

    def key_of(owner: int, armed: frozenset) -> tuple:
        return ("slot", plan.input_slot(owner)) if not armed else (owner, armed)

    root_armed = frozenset(c for c in plan.children[0] if circuit.hash in reach[c])
    stack: list = [(circuit, key_of(0, root_armed), (0, root_armed), None)]
    while stack:
        node, key, state, kids = stack.pop()
        mk = (node.hash, key)
        if kids is None:
            if mk in memo:
                continue
            owner, armed = state
            hit = [c for c in armed if node.hash in sites[c]]
            if len(hit) > 1:
                names = ", ".join(repr(claims[c].name) for c in hit)
                raise CircuitError(f"claims {names} all claim {node.line()}: a path may belong to one claim only; "
                                   f"narrow their sites or make one the child of the other")
            if hit:
                owner = hit[0]
                entered.add(owner)
                armed = frozenset(plan.children[owner])
            if isinstance(node, Symbol):
                slot = plan.input_slot(owner)
                owned.setdefault(owner, set()).add(slot)
                memo[mk] = Symbol(node.shape, name=slot_name(node.name, slot), dtype=node.dtype)
                continue
            through = frozenset(c for c in armed if node.hash not in avoid[c])
            kids = []
            for ch in node.children:
                if ch.hash not in has_input:
                    kids.append((ch, None))
                    continue
                ch_armed = frozenset(c for c in through if ch.hash in reach[c])
                kids.append((ch, key_of(owner, ch_armed), (owner, ch_armed)))
            stack.append((node, key, state, kids))
            for item in kids:
                if item[1] is not None and (item[0].hash, item[1]) not in memo:
                    stack.append((item[0], item[1], item[2], None))
            continue
        new_children = tuple(ch if k is None else memo[(ch.hash, k)] for ch, k, *_ in kids)
        memo[mk] = node.with_children(new_children)

    for i in range(1, len(claims)):
        if i not in entered:
            raise _not_reached(i, plan, sites, has_input, circuit)
    root_key = key_of(0, root_armed)
    slots = sorted(set().union(*owned.values())) if owned else []
    return Treeified(memo[(circuit.hash, root_key)] if circuit.hash in has_input else circuit, slots, owned)


def _ancestors(hashes: set[bytes], parents: dict[bytes, list[Circuit]]) -> set[bytes]:
    """``hashes`` and every node above one of them."""
    out = set(hashes)
    stack = list(hashes)
    while stack:
        for p in parents.get(stack.pop(), ()):
            if p.hash not in out:
                out.add(p.hash)
                stack.append(p.hash)
    return out


def _not_reached(i: int, plan: SlotPlan, sites, has_input, circuit: Circuit) -> CircuitError:
    claim, parent = plan.claims[i], plan.claims[plan.parent[i]]
    where = f"claim {claim.name!r} (site {claim.site.describe()}, child of {parent.name!r})"
    if not sites[i]:
        return CircuitError(f"{where}: its site matches no node of the circuit {circuit.line()}")
    if not sites[i] & has_input:
        return CircuitError(f"{where}: its site does not depend on the inputs (it matches only nodes with no input "
                            f"below them); claim a node the inputs flow through")
    avoided = f" by paths avoiding {', '.join(a.describe() for a in claim.avoid)}" if claim.avoid else ""
    return CircuitError(f"{where}: its site does not feed its parent's site {parent.site.describe()}{avoided} "
                        f"(or every such path is taken by a sibling claim first): a child claim must lie below "
                        f"its parent's site")
