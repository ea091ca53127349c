"""Tag: an identity op that makes otherwise-equal subtrees distinct."""

from __future__ import annotations

import uuid as uuid_module

from .base import Circuit, check_children, convert_payload
from .leaves import as_uuid


class Tag(Circuit):
    """Identity on its one child, carrying a uuid so that two copies of a subtree can be told
    apart (and so rewritten or patched separately).

    >>> from circuits import Scalar
    >>> t = Tag(Scalar(1.0), uuid='00000000-0000-0000-0000-000000000001')
    >>> t.line()
    'Tag 00000000-0000-0000-0000-000000000001'
    """

    __slots__ = ("uuid",)
    rebuilds_by_shape = True
    type_name = "Tag"
    child_count = (1, 1)
    passes_index = True

    uuid: uuid_module.UUID

    def _setup(self, child, uuid=None, name=None):
        (child,) = check_children("Tag", name, (child,))
        if uuid is None:
            uuid = uuid_module.uuid4()
        else:
            uuid = as_uuid(uuid, lambda: f"Tag {name!r} over {child.line()}")
        self.uuid = uuid
        return self._set_common((child,), child.shape, child.dtype, name)

    @classmethod
    def parse_payload(cls, text):
        return convert_payload(cls, text, uuid_module.UUID, "its uuid", "a uuid",
                               "a uuid like 00000000-0000-0000-0000-000000000001")

    @classmethod
    def from_payload(cls, payload, children, name=None, shape=None, context=None):
        return cls(children[0], payload, name=name)

    def _payload_bytes(self):
        return self.uuid.bytes

    def payload_text(self):
        return str(self.uuid)

    def expanded(self, children, gained, size_map, replacements=None):
        """The same tag over the expanded child."""
        return Tag(children[0], self.uuid, name=self.name)

    def _rebuild(self, children, name):
        (child,) = children
        return Tag(child, self.uuid, name=name)
