"""The chat screen's widgets: header line, conversation, answer, stats panel, prompt input."""

from dflash_tui.tui.widgets.answer import AnswerView, NoticeLine, UserMessage
from dflash_tui.tui.widgets.header import ChatHeader
from dflash_tui.tui.widgets.prompt import PromptInput
from dflash_tui.tui.widgets.stats import StatsLine, StatsPanel

__all__ = ["AnswerView", "ChatHeader", "NoticeLine", "PromptInput", "StatsLine", "StatsPanel", "UserMessage"]
