"""The chat screen's widgets: header line, conversation, answer, stats panel, prompt input."""

from .answer import AnswerView, NoticeLine, UserMessage
from .header import ChatHeader
from .prompt import PromptInput
from .stats import StatsLine, StatsPanel

__all__ = ["AnswerView", "ChatHeader", "NoticeLine", "PromptInput", "StatsLine", "StatsPanel", "UserMessage"]
