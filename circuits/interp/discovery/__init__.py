"""Circuit discovery over a transformer's head-level graph: edges, patching edges, scores, found circuits.

``edges(circuit)`` is the graph (sources: the embeddings, each head, each MLP; destinations: each
head's q, k, v input, each MLP, the output), ``patch_edges`` patches exactly the edges named,
``discover`` scores every edge (EAP, EAP-IG, EAP-IG-mask, ACDC, exact), ``FoundCircuit`` is the
edges a method keeps as a plain circuit, ``faithfulness`` the metric against circuit size.

The modules behind this face are private: ``_graph`` (the graph and edge patching), ``_scores``
(every edge's first-order score from one program), ``_exact`` (every edge patched alone in one
row-sparse program), ``_discover`` (the methods and ``Discovery``), ``_found``, ``_faithfulness``.

>>> import numpy as np
>>> from circuits.models import attn_only, random_weights
>>> w = random_weights(vocab=11, d_model=8, n_heads=2, head_size=4, n_layers=2, max_positions=16)
>>> loss = attn_only(w, np.array([0, 1, 2, 3, 1, 2]), unique_names=True)
>>> result = discover(loss, {'toks_int_var': np.array([0, 4, 5, 6, 1, 2])}, method='exact')
>>> len(edges(loss)) == len(result)
True
"""

from ..metric import metric_node  # noqa: F401  (its home is circuits.interp.metric; kept here one release)
from ._discover import METHODS, Discovery, discover
from ._faithfulness import Faithfulness, faithfulness
from ._found import FoundCircuit
from ._graph import ABLATIONS, Edges, edges, patch_edges

__all__ = ["edges", "Edges", "patch_edges", "discover", "Discovery", "METHODS", "ABLATIONS", "FoundCircuit",
           "faithfulness", "Faithfulness"]
