"""Text boxes that keep a burst of keys in order.

Textual hands each key to the focused box, and runs the key's binding (ctrl+u, ctrl+a, backspace, the
arrows, enter) only once the key has bubbled up to the app, one widget's queue at a time. The keys behind
it in the same burst (fast typing on a busy machine, a terminal's type-ahead) are typed into the box in
the meantime: `hello`, ctrl+u, `world` left an empty box, and ctrl+a then `X` gave `abc defX`. A box here
runs the binding in the key's own turn instead, before it looks at the next key; a key it takes as text,
or one nothing binds, goes the usual way.
"""

from __future__ import annotations

from textual import events
from textual.command import CommandInput
from textual.widgets import Input, TextArea


class InTurn:
    """Mixed into a text box (before Input or TextArea): bindings run in the key's turn."""

    async def _on_key(self, event: events.Key) -> None:
        await super()._on_key(event)  # type: ignore[misc]  # the box's own keys first: text, enter in a TextArea
        if event._stop_propagation:  # taken (Textual keeps no public flag for it)
            return
        # Textual's own order, from this box up to its screen (a modal one) or the app: the box's bindings,
        # then its containers'. From this box, not from the focus: a key of the burst may be handled here
        # after a key before it (escape) moved the focus on. Priority bindings were offered the key already.
        for node in self.ancestors_with_self:  # type: ignore[attr-defined]
            for binding in node._bindings.key_to_bindings.get(event.key, ()):
                if not binding.priority and await self.app.run_action(binding.action, node):  # type: ignore[attr-defined]
                    event.stop()
                    event.prevent_default()
                    return
            if node.is_modal:
                return


class TextInput(InTurn, Input):
    """A one-line box (titles, searches, the find bar, the replay's fields)."""


class TextBox(InTurn, TextArea):
    """A box of several lines (the system prompt)."""


class PaletteInput(InTurn, CommandInput):
    """The command palette's query box."""

