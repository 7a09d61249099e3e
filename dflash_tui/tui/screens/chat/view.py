"""The scrolling conversation, and the marker that says new text arrived below a reader who scrolled up."""

from __future__ import annotations

from typing import Optional

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static


class NewTextMarker(Static):
    """Shown under a conversation the reader scrolled up in while text arrived below; a click goes there."""

    def on_click(self) -> None:
        self.screen.query_one("#conversation", ConversationView).follow()


class ConversationView(VerticalScroll):
    """The conversation, following its end through new text, a resize, a taller message box and a resume,
    until the reader scrolls up. From then on it keeps the line they were on through whatever changes the
    heights above it (ghosts shown or hidden, a resize, an answer as written), and nothing else moves them,
    not even the answer ending. Scrolling back to the end (the wheel, pagedown, ctrl+end) or sending follows
    again. (Textual's own `anchor()` pushes a short conversation to the bottom of the view, under an empty top.)"""

    following = True
    place: Optional[tuple[Widget, int]] = None  # while not following: the widget at the top, and rows into it

    def follow(self) -> None:
        self.following = True
        self.scroll_end(animate=False)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y - 0.5:
            self.following = True
            for marker in self.screen.query("#new-text"):  # back at the end: nothing new below
                marker.display = False
        elif new_value < old_value:  # up, by the reader: a longer text below only raises max_scroll_y
            self.following = False
        self.place = None if self.following else self._line_at(round(new_value))

    def _line_at(self, y: int) -> Optional[tuple[Widget, int]]:
        for child in self.children:
            if child.display:
                region = child.virtual_region
                if region.bottom > y:
                    return child, y - region.y
        return None

    def _size_updated(self, size, virtual_size, container_size, layout: bool = True) -> bool:
        """The layout changed: to the end for a follower, else back to the reader's line where it now lies.
        In the same pass that moved it (a callback after the next refresh could run before the heights above
        the reader have changed, and then nothing would put them back)."""
        place = self.place  # as the reader left it: the clamp of scroll_y below may recompute it
        changed = super()._size_updated(size, virtual_size, container_size, layout)
        if changed and self.following:
            self.call_after_refresh(self._to_end)
        elif changed and place is not None and place[0].is_attached:
            widget, rows = place
            self.scroll_to(y=widget.virtual_region.y + rows, animate=False, immediate=True)
        return changed

    def _to_end(self) -> None:
        if self.following:
            self.scroll_end(animate=False, immediate=True)
